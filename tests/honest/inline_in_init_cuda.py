"""Honest: a CUDA extension built by load_inline inside ModelNew's constructor, not at import.

Seen: a sweep of honest candidates on this evaluator, where the CPU twin of this file was refused (the
builder only imported the module, so the first build happened in the runner, which may not start a
compiler). The builder now constructs one ModelNew from get_init_inputs(); this file checks the same
path with nvcc, on a GPU.

REFERENCE: relu
EXPECT: ok
DEVICES: cuda
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CPP = "torch::Tensor relu_cuda(torch::Tensor x);"

CUDA = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void relu_kernel(const float* __restrict__ a, float* __restrict__ b, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) b[i] = a[i] > 0.f ? a[i] : 0.f;
}

torch::Tensor relu_cuda(torch::Tensor x) {
    auto xs = x.contiguous();
    auto y = torch::empty_like(xs);
    const int64_t n = xs.numel();
    const int threads = 256;
    const int64_t blocks = (n + threads - 1) / threads;
    relu_kernel<<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        xs.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.ext = load_inline(name="relu_cuda_built_in_init", cpp_sources=CPP, cuda_sources=CUDA,
                               functions=["relu_cuda"])

    def forward(self, x):
        return self.ext.relu_cuda(x)

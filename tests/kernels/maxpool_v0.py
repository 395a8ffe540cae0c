"""Honest candidate for maxpool@v0 (KernelBench level1 #42 at v0 sizes: MaxPool2d(kernel 2, stride 2,
padding 1, dilation 3) on (16, 32, 128, 128), output (16, 32, 64, 64)).

One thread per output element, with nn.MaxPool2d's semantics (ceil_mode off): the output side is
floor((in + 2 * padding - dilation * (kernel - 1) - 1) / stride) + 1; window element (kh, kw) of output
(oh, ow) reads input row oh * stride - padding + kh * dilation (columns alike); elements that fall in the
padding are skipped (they never win, as PyTorch's implicit -inf padding), and a NaN in the window makes
the output NaN, as in PyTorch. Consecutive threads take consecutive output columns.

A launch-bound problem: about 10-20 us per call on an H100/H200.
Expected evaluator status: "ok".
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_src = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>
#include <math_constants.h>

constexpr int kBlock = 256;

// x: (planes, H, W) contiguous, planes = N * C; out: (planes, OH, OW).
__global__ void max_pool_2d(const float* __restrict__ x, float* __restrict__ out, long total,
                            int H, int W, int OH, int OW, int kernel, int stride, int padding, int dilation) {
    const long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= total) return;
    const int ow = (int)(idx % OW);
    const int oh = (int)((idx / OW) % OH);
    const long plane = idx / ((long)OW * OH);
    const float* src = x + plane * H * W;
    const int h0 = oh * stride - padding, w0 = ow * stride - padding;
    float best = -CUDART_INF_F;
    for (int kh = 0; kh < kernel; ++kh) {
        const int ih = h0 + kh * dilation;
        if (ih < 0 || ih >= H) continue;
        for (int kw = 0; kw < kernel; ++kw) {
            const int iw = w0 + kw * dilation;
            if (iw < 0 || iw >= W) continue;
            const float v = src[(long)ih * W + iw];
            if (v > best || v != v) best = v;  // v != v: NaN wins, as in PyTorch
        }
    }
    out[idx] = best;
}

torch::Tensor max_pool2d(torch::Tensor x, int64_t kernel, int64_t stride, int64_t padding, int64_t dilation) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == at::kFloat && x.dim() == 4, "x: 4-D fp32 CUDA tensor");
    TORCH_CHECK(kernel > 0 && stride > 0 && dilation > 0 && padding >= 0 && 2 * padding <= kernel,
                "unsupported pooling parameters");
    x = x.contiguous();
    const long N = x.size(0), C = x.size(1);
    const int H = (int)x.size(2), W = (int)x.size(3);
    const int OH = (int)((H + 2 * padding - dilation * (kernel - 1) - 1) / stride + 1);
    const int OW = (int)((W + 2 * padding - dilation * (kernel - 1) - 1) / stride + 1);
    TORCH_CHECK(OH > 0 && OW > 0, "output would be empty");
    auto out = torch::empty({N, C, OH, OW}, x.options());
    const long total = N * C * (long)OH * OW;
    if (total == 0) return out;
    const unsigned blocks = (unsigned)((total + kBlock - 1) / kBlock);
    max_pool_2d<<<blocks, kBlock, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), out.data_ptr<float>(), total, H, W, OH, OW,
        (int)kernel, (int)stride, (int)padding, (int)dilation);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

cpp_src = "torch::Tensor max_pool2d(torch::Tensor x, int64_t kernel, int64_t stride, int64_t padding, int64_t dilation);"

ext = load_inline(
    name="pacevolve_maxpool_v0",
    cpp_sources=cpp_src,
    cuda_sources=cuda_src,
    functions=["max_pool2d"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, kernel_size: int, stride: int, padding: int, dilation: int):
        super().__init__()
        self.kernel_size, self.stride, self.padding, self.dilation = kernel_size, stride, padding, dilation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ext.max_pool2d(x, self.kernel_size, self.stride, self.padding, self.dilation)

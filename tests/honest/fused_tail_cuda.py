"""Honest: a CUDA load_inline kernel for the tail, after library conv and GroupNorm.

Several kernels run in sequence (cuDNN conv, GroupNorm, then one custom fused
kernel: tanh -> hardswish -> residual add -> logsumexp over channels, one
thread per output pixel) on the current stream. `hardswish_of_tanh` is a
__device__ helper.

REFERENCE: gn_cuda
EXPECT: ok
DEVICES: cuda
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CUDA = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

__device__ __forceinline__ float hardswish_of_tanh(float v) {
    const float t = tanhf(v);
    return t * (t + 3.0f) / 6.0f;
}

__global__ void fused_tail_kernel(const float* __restrict__ y, const float* __restrict__ norm,
                                  float* __restrict__ out, long long n_pix, long long C, long long HW) {
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= n_pix) return;
    const long long n = idx / HW, p = idx % HW;
    const float* yb = y + n * C * HW + p;
    const float* nb = norm + n * C * HW + p;
    float m = -INFINITY;
    for (long long c = 0; c < C; ++c) m = fmaxf(m, yb[c * HW] + hardswish_of_tanh(nb[c * HW]));
    float s = 0.0f;
    for (long long c = 0; c < C; ++c) s += expf(yb[c * HW] + hardswish_of_tanh(nb[c * HW]) - m);
    out[idx] = m + logf(s);
}

torch::Tensor fused_tail(torch::Tensor y, torch::Tensor norm) {
    TORCH_CHECK(y.is_cuda() && norm.is_cuda(), "CUDA tensors expected");
    TORCH_CHECK(y.dim() == 4 && y.sizes() == norm.sizes(), "y and norm must be NCHW of one shape");
    TORCH_CHECK(y.scalar_type() == torch::kFloat32, "float32 only");
    auto yc = y.contiguous();
    auto nc = norm.contiguous();
    const long long N = yc.size(0), C = yc.size(1), H = yc.size(2), W = yc.size(3);
    auto out = torch::empty({N, 1, H, W}, yc.options());
    const long long n_pix = N * H * W;
    const int threads = 256;
    const int blocks = (int)((n_pix + threads - 1) / threads);
    fused_tail_kernel<<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        yc.data_ptr<float>(), nc.data_ptr<float>(), out.data_ptr<float>(), n_pix, C, H * W);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""
_CPP = "#include <torch/extension.h>\ntorch::Tensor fused_tail(torch::Tensor y, torch::Tensor norm);\n"
_ext = load_inline(name="pacevolve_honest_gn_tail_cuda", cpp_sources=[_CPP], cuda_sources=[_CUDA],
                   functions=["fused_tail"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups, eps=1e-5):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.group_norm = nn.GroupNorm(groups, out_channels, eps=eps)

    def forward(self, x):
        y = self.conv(x)
        return _ext.fused_tail(y, self.group_norm(y))

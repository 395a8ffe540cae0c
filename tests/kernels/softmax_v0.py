"""Honest candidate for softmax@v0 (KernelBench level1 #23 at v0 sizes: softmax over dim 1 of (16, 16384)).

One block of 1024 threads per row, three passes over the row (64 KB, so passes two and three read it from
L2): the row's maximum, the sum of exp(x - max), then exp(x - max) / sum. Reductions go warp shuffle, then
shared memory across the block's warps. All arithmetic fp32 with expf (not the fast __expf), so the
result differs from PyTorch's only in summation order (relative error ~1e-7).

A launch-bound problem: about 10-25 us per call on an H100/H200, comparable to PyTorch's own kernel.
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

constexpr int kBlock = 1024;  // a multiple of 32, at most 32 warps (one shared slot per warp)

// Every thread returns the block's maximum of v.
__device__ float block_max(float v, float* smem) {
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    if (lane == 0) smem[warp] = v;
    __syncthreads();
    v = (lane < nwarps) ? smem[lane] : -CUDART_INF_F;
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    __syncthreads();  // smem is reused by the next reduction
    return v;
}

// Every thread returns the block's sum of v.
__device__ float block_sum(float v, float* smem) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    if (lane == 0) smem[warp] = v;
    __syncthreads();
    v = (lane < nwarps) ? smem[lane] : 0.f;
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    __syncthreads();
    return v;
}

// grid: one block per row of a contiguous (rows, cols) matrix.
__global__ void softmax_rows(const float* __restrict__ x, float* __restrict__ out, long cols) {
    __shared__ float smem[32];
    const float* row = x + (long)blockIdx.x * cols;
    float* dst = out + (long)blockIdx.x * cols;

    float m = -CUDART_INF_F;
    for (long i = threadIdx.x; i < cols; i += blockDim.x) m = fmaxf(m, row[i]);
    m = block_max(m, smem);

    float s = 0.f;
    for (long i = threadIdx.x; i < cols; i += blockDim.x) s += expf(row[i] - m);
    s = block_sum(s, smem);

    const float inv = 1.f / s;
    for (long i = threadIdx.x; i < cols; i += blockDim.x) dst[i] = expf(row[i] - m) * inv;
}

torch::Tensor softmax_dim1(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == at::kFloat && x.dim() == 2, "x: 2-D fp32 CUDA tensor");
    x = x.contiguous();
    auto out = torch::empty_like(x);
    const long rows = x.size(0), cols = x.size(1);
    if (rows == 0 || cols == 0) return out;
    softmax_rows<<<(unsigned)rows, kBlock, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), out.data_ptr<float>(), cols);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

cpp_src = "torch::Tensor softmax_dim1(torch::Tensor x);"

ext = load_inline(
    name="pacevolve_softmax_v0",
    cpp_sources=cpp_src,
    cuda_sources=cuda_src,
    functions=["softmax_dim1"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ext.softmax_dim1(x)

"""Honest candidate for mean@v0 (KernelBench level1 #48 at v0 sizes: torch.mean over dim 1 of (16, 256, 256)).

The input is viewed as (outer, R, inner) with R the reduced dimension; the output is (outer, inner).
A block of 32 x 8 threads owns 32 adjacent output columns of one outer index: thread (tx, ty) sums rows
ty, ty + 8, ... of its column, so each warp reads 32 consecutive floats (128 bytes, coalesced) per row;
the 8 partial sums per column are then added in shared memory and divided by R. Accumulation in fp64,
so the result is at least as accurate as PyTorch's fp32 sum (they differ by ~1e-7 relative).
Grid: (inner / 32, outer) = (8, 16) = 128 blocks at v0 sizes.

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

constexpr int kCols = 32;  // output columns per block (threadIdx.x)
constexpr int kRows = 8;   // threads splitting the reduced dimension (threadIdx.y)

// x viewed as (outer, R, inner); out as (outer, inner). grid (ceil(inner / kCols), min(outer, 65535)).
__global__ void mean_middle(const float* __restrict__ x, float* __restrict__ out,
                            long outer, long R, long inner) {
    __shared__ double partial[kRows][kCols + 1];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const long col = (long)blockIdx.x * kCols + tx;
    for (long o = blockIdx.y; o < outer; o += gridDim.y) {  // uniform across the block
        double s = 0.0;
        if (col < inner) {
            const float* base = x + o * R * inner + col;
            for (long r = ty; r < R; r += kRows) s += (double)base[r * inner];
        }
        partial[ty][tx] = s;
        __syncthreads();
        if (ty == 0 && col < inner) {
            double total = 0.0;
            for (int k = 0; k < kRows; ++k) total += partial[k][tx];
            out[o * inner + col] = (float)(total / (double)R);
        }
        __syncthreads();  // partial is rewritten by the next outer index
    }
}

torch::Tensor mean_dim(torch::Tensor x, int64_t dim) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == at::kFloat && x.dim() >= 1, "x: fp32 CUDA tensor");
    const int64_t nd = x.dim();
    if (dim < 0) dim += nd;
    TORCH_CHECK(dim >= 0 && dim < nd, "dim out of range");
    x = x.contiguous();
    long outer = 1, inner = 1;
    for (int64_t d = 0; d < dim; ++d) outer *= x.size(d);
    for (int64_t d = dim + 1; d < nd; ++d) inner *= x.size(d);
    const long R = x.size(dim);
    TORCH_CHECK(R > 0, "mean over an empty dimension");
    std::vector<int64_t> shape;
    for (int64_t d = 0; d < nd; ++d) if (d != dim) shape.push_back(x.size(d));
    auto out = torch::empty(shape, x.options());
    if (outer == 0 || inner == 0) return out;
    const dim3 block(kCols, kRows);
    const dim3 grid((unsigned)((inner + kCols - 1) / kCols), (unsigned)(outer < 65535 ? outer : 65535));
    mean_middle<<<grid, block, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), out.data_ptr<float>(), outer, R, inner);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

cpp_src = "torch::Tensor mean_dim(torch::Tensor x, int64_t dim);"

ext = load_inline(
    name="pacevolve_mean_v0",
    cpp_sources=cpp_src,
    cuda_sources=cuda_src,
    functions=["mean_dim"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ext.mean_dim(x, self.dim)

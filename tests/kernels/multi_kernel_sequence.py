"""Honest candidate for conv_groupnorm that launches several kernels in sequence.

After the cuDNN convolution (nn.Conv2d, created first so its weights match the reference's), three CUDA
launches on the current stream, each consuming the previous one's output:
  1. GroupNorm statistics per (sample, group), shifted sums with an fp64 cross-thread reduction;
  2. an elementwise kernel writing z = conv + hardswish(tanh(groupnorm(conv))) to a full-size buffer;
  3. a log-sum-exp over channels of z (running max), one output per pixel.
Slower than the single fused tail (it writes and re-reads the 520 MB intermediate) but exact: it shows
that a chain of dependent launches is timed and checked like a single kernel.

Expected evaluator status: "ok" (relative L2 error ~1e-7); usually faster than the reference.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_src = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>

constexpr int kBlock = 256;

__device__ __forceinline__ double block_sum(double v, double* smem) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) smem[warp] = v;
    __syncthreads();
    const int nwarps = (blockDim.x + 31) >> 5;
    v = (threadIdx.x < nwarps) ? smem[threadIdx.x] : 0.0;
    if (warp == 0) {
        for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
    }
    __syncthreads();
    return v;
}

__global__ void stats_kernel(const float* __restrict__ y, float* __restrict__ mean_out,
                             float* __restrict__ rstd_out, long group_elems, float eps) {
    __shared__ double smem[32];
    const float* base = y + (long)blockIdx.x * group_elems;
    const float shift = base[0];
    float s1 = 0.f, s2 = 0.f;
    for (long i = threadIdx.x; i < group_elems; i += blockDim.x) {
        const float a = base[i] - shift;
        s1 += a;
        s2 += a * a;
    }
    const double t1 = block_sum((double)s1, smem);
    const double t2 = block_sum((double)s2, smem);
    if (threadIdx.x == 0) {
        const double m = t1 / (double)group_elems;
        double var = t2 / (double)group_elems - m * m;
        if (var < 0.0) var = 0.0;
        mean_out[blockIdx.x] = (float)((double)shift + m);
        rstd_out[blockIdx.x] = (float)(1.0 / sqrt(var + (double)eps));
    }
}

// z[n,c,p] = y + hardswish(tanh((y - mean) * rstd * gamma + beta))
__global__ void normalise_kernel(const float* __restrict__ y, const float* __restrict__ mean,
                                 const float* __restrict__ rstd, const float* __restrict__ gamma,
                                 const float* __restrict__ beta, float* __restrict__ z,
                                 long total, int C, int G, long HW) {
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const long nc = i / HW;
    const int c = (int)(nc % C);
    const long n = nc / C;
    const long g = n * G + c / (C / G);
    const float v = y[i];
    const float a = rstd[g] * gamma[c];
    const float xn = fmaf(v, a, beta[c] - mean[g] * a);
    const float t = tanhf(xn);
    z[i] = v + t * fminf(fmaxf(t + 3.f, 0.f), 6.f) / 6.f;
}

// out[n,0,p] = max_c z + log(sum_c exp(z - max)), two sweeps over the channels (max, then sum).
__global__ void lse_kernel(const float* __restrict__ z, float* __restrict__ out, int N, int C, long HW) {
    const long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long)N * HW) return;
    const long n = idx / HW, p = idx - n * HW;
    const float* src = z + n * C * HW + p;
    float m = -INFINITY;
    for (int c = 0; c < C; ++c) m = fmaxf(m, src[(long)c * HW]);
    float s = 0.f;
    for (int c = 0; c < C; ++c) s += expf(src[(long)c * HW] - m);
    out[idx] = m + logf(s);
}

torch::Tensor groupnorm_tail_3k(torch::Tensor y, torch::Tensor gamma, torch::Tensor beta,
                                int64_t groups, double eps) {
    TORCH_CHECK(y.is_cuda() && y.scalar_type() == at::kFloat && y.dim() == 4, "y: 4-D fp32 CUDA tensor");
    y = y.contiguous();
    gamma = gamma.contiguous();
    beta = beta.contiguous();
    const int N = (int)y.size(0), C = (int)y.size(1), G = (int)groups;
    TORCH_CHECK(C % G == 0, "channels must be divisible by groups");
    const long HW = (long)y.size(2) * y.size(3);
    auto mean = torch::empty({N * G}, y.options());
    auto rstd = torch::empty({N * G}, y.options());
    auto z = torch::empty_like(y);
    auto out = torch::empty({N, 1, y.size(2), y.size(3)}, y.options());
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();

    stats_kernel<<<N * G, kBlock, 0, stream>>>(y.data_ptr<float>(), mean.data_ptr<float>(),
                                               rstd.data_ptr<float>(), (long)(C / G) * HW, (float)eps);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    const long total = y.numel();
    normalise_kernel<<<(unsigned)((total + kBlock - 1) / kBlock), kBlock, 0, stream>>>(
        y.data_ptr<float>(), mean.data_ptr<float>(), rstd.data_ptr<float>(), gamma.data_ptr<float>(),
        beta.data_ptr<float>(), z.data_ptr<float>(), total, C, G, HW);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    const long pixels = (long)N * HW;
    lse_kernel<<<(unsigned)((pixels + kBlock - 1) / kBlock), kBlock, 0, stream>>>(
        z.data_ptr<float>(), out.data_ptr<float>(), N, C, HW);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

cpp_src = "torch::Tensor groupnorm_tail_3k(torch::Tensor y, torch::Tensor gamma, torch::Tensor beta, int64_t groups, double eps);"

ext = load_inline(
    name="pacevolve_cg_three_kernels",
    cpp_sources=cpp_src,
    cuda_sources=cuda_src,
    functions=["groupnorm_tail_3k"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups, eps=1e-5):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.group_norm = nn.GroupNorm(groups, out_channels, eps=eps)
        self.groups = groups
        self.eps = eps

    def forward(self, x):
        y = self.conv(x)
        return ext.groupnorm_tail_3k(y, self.group_norm.weight, self.group_norm.bias, self.groups, self.eps)

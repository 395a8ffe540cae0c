"""Honest CPU candidate for conv_groupnorm_small: nn.Conv2d, then a C++ (load_inline, cpp_sources only)
fused tail.

The C++ function computes the GroupNorm statistics of each (sample, group) in double precision (a
group is a contiguous run of (C/G)*H*W floats in NCHW), then, per pixel, normalise + affine, tanh,
hardswish, residual add of the conv output and a log-sum-exp over the channels (max first, then the
sum of exponentials), parallelised over samples with at::parallel_for.

Expected evaluator status: "ok" on CPU.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_src = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cmath>
#include <vector>

torch::Tensor groupnorm_tail_cpu(torch::Tensor y, torch::Tensor gamma, torch::Tensor beta,
                                 int64_t groups, double eps) {
    TORCH_CHECK(!y.is_cuda() && y.scalar_type() == at::kFloat && y.dim() == 4, "y: 4-D fp32 CPU tensor");
    y = y.contiguous();
    gamma = gamma.contiguous();
    beta = beta.contiguous();
    const int64_t N = y.size(0), C = y.size(1), HW = y.size(2) * y.size(3);
    TORCH_CHECK(C % groups == 0, "channels must be divisible by groups");
    const int64_t cpg = C / groups, group_elems = cpg * HW;
    auto out = torch::empty({N, 1, y.size(2), y.size(3)}, y.options());
    const float* yp = y.data_ptr<float>();
    const float* gp = gamma.data_ptr<float>();
    const float* bp = beta.data_ptr<float>();
    float* op = out.data_ptr<float>();

    at::parallel_for(0, N, 1, [&](int64_t n0, int64_t n1) {
        std::vector<float> scale(C), offset(C), r(C);
        for (int64_t n = n0; n < n1; ++n) {
            const float* yn = yp + n * C * HW;
            for (int64_t g = 0; g < groups; ++g) {
                const float* base = yn + g * group_elems;
                double s1 = 0.0, s2 = 0.0;
                for (int64_t i = 0; i < group_elems; ++i) s1 += base[i];
                const double mean = s1 / (double)group_elems;
                for (int64_t i = 0; i < group_elems; ++i) {
                    const double d = base[i] - mean;
                    s2 += d * d;
                }
                const double rstd = 1.0 / std::sqrt(s2 / (double)group_elems + eps);
                for (int64_t c = g * cpg; c < (g + 1) * cpg; ++c) {
                    scale[c] = (float)(rstd * gp[c]);
                    offset[c] = (float)(bp[c] - mean * rstd * gp[c]);
                }
            }
            for (int64_t p = 0; p < HW; ++p) {
                float m = -INFINITY;
                for (int64_t c = 0; c < C; ++c) {
                    const float v = yn[c * HW + p];
                    const float t = std::tanh(v * scale[c] + offset[c]);
                    r[c] = v + t * std::min(std::max(t + 3.f, 0.f), 6.f) / 6.f;
                    m = std::max(m, r[c]);
                }
                double s = 0.0;
                for (int64_t c = 0; c < C; ++c) s += std::exp((double)(r[c] - m));
                op[n * HW + p] = m + (float)std::log(s);
            }
        }
    });
    return out;
}
"""

ext = load_inline(
    name="pacevolve_cg_small_cpp",
    cpp_sources=cpp_src,
    functions=["groupnorm_tail_cpu"],
    extra_cflags=["-O2"],
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
        return ext.groupnorm_tail_cpu(y, self.group_norm.weight, self.group_norm.bias, self.groups, self.eps)

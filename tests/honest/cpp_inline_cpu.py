"""Honest: a C++ load_inline extension on CPU with a helper function.

The convolution and GroupNorm stay torch library calls; the tail (tanh ->
hardswish -> residual add -> logsumexp over channels) is one C++ loop nest.
`hardswish_of_tanh` is a static helper function in the C++ source. The module
prints a line while building, as LLM-written candidates often do; that output
must not confuse the evaluator.

REFERENCE: gn
EXPECT: ok
DEVICES: cpu
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CPP_SOURCE = r"""
#include <torch/extension.h>
#include <cmath>
#include <limits>

static inline float hardswish_of_tanh(float v) {
    const float t = std::tanh(v);
    return t * (t + 3.0f) / 6.0f;   // tanh is in (-1, 1): the relu6 clamp never fires
}

torch::Tensor fused_tail(torch::Tensor y, torch::Tensor norm) {
    TORCH_CHECK(y.dim() == 4 && y.sizes() == norm.sizes(), "y and norm must be NCHW of one shape");
    TORCH_CHECK(y.scalar_type() == torch::kFloat32, "float32 only");
    auto yc = y.contiguous();
    auto nc = norm.contiguous();
    const int64_t N = yc.size(0), C = yc.size(1), H = yc.size(2), W = yc.size(3), HW = H * W;
    auto out = torch::empty({N, 1, H, W}, yc.options());
    const float* py = yc.data_ptr<float>();
    const float* pn = nc.data_ptr<float>();
    float* po = out.data_ptr<float>();
    for (int64_t n = 0; n < N; ++n) {
        for (int64_t p = 0; p < HW; ++p) {
            float m = -std::numeric_limits<float>::infinity();
            for (int64_t c = 0; c < C; ++c) {
                const int64_t i = (n * C + c) * HW + p;
                m = std::max(m, py[i] + hardswish_of_tanh(pn[i]));
            }
            double s = 0.0;
            for (int64_t c = 0; c < C; ++c) {
                const int64_t i = (n * C + c) * HW + p;
                s += std::exp(static_cast<double>(py[i] + hardswish_of_tanh(pn[i]) - m));
            }
            po[n * HW + p] = m + static_cast<float>(std::log(s));
        }
    }
    return out;
}
"""

print("building the C++ tail extension...")
_ext = load_inline(name="pacevolve_honest_gn_tail_cpu", cpp_sources=[CPP_SOURCE],
                   functions=["fused_tail"], extra_cflags=["-O2"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups, eps=1e-5):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.group_norm = nn.GroupNorm(groups, out_channels, eps=eps)

    def forward(self, x):
        y = self.conv(x)
        return _ext.fused_tail(y, self.group_norm(y))

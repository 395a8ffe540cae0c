# Honest C++ candidate: conv and GroupNorm from PyTorch, the fused tail in a load_inline C++ function.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_src = r"""
#include <cmath>
torch::Tensor fused_tail(torch::Tensor conv, torch::Tensor norm) {
    auto c = conv.contiguous(); auto n = norm.contiguous();
    const int64_t N = c.size(0), C = c.size(1), HW = c.size(2) * c.size(3);
    auto out = torch::empty({N, 1, c.size(2), c.size(3)}, c.options());
    const float* pc = c.data_ptr<float>(); const float* pn = n.data_ptr<float>(); float* po = out.data_ptr<float>();
    for (int64_t b = 0; b < N; ++b) {
        for (int64_t p = 0; p < HW; ++p) {
            float mx = -INFINITY;
            for (int64_t ch = 0; ch < C; ++ch) {
                int64_t i = (b * C + ch) * HW + p;
                float t = std::tanh(pn[i]);
                float v = pc[i] + t * (t + 3.0f) / 6.0f;
                mx = v > mx ? v : mx;
            }
            double s = 0.0;
            for (int64_t ch = 0; ch < C; ++ch) {
                int64_t i = (b * C + ch) * HW + p;
                float t = std::tanh(pn[i]);
                s += std::exp((double)(pc[i] + t * (t + 3.0f) / 6.0f - mx));
            }
            po[b * HW + p] = mx + (float)std::log(s);
        }
    }
    return out;
}
"""
ext = load_inline(name="fused_tail_cpp", cpp_sources=cpp_src, functions=["fused_tail"])


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups, eps=1e-5):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.group_norm = nn.GroupNorm(groups, out_channels, eps=eps)

    def forward(self, x):
        x_conv = self.conv(x)
        return ext.fused_tail(x_conv, self.group_norm(x_conv))

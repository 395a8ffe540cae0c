"""Honest: keeps nn.Conv2d (cuDNN/oneDNN) and fuses the tail in plain torch ops.

Partial replacement is legal in KernelBench: the convolution stays a library
call; GroupNorm is written out as a grouped var_mean, and tanh -> hardswish ->
residual -> logsumexp uses hardswish(t) = t*(t+3)/6, exact because tanh is in
(-1, 1) so the relu6 clamp never fires.

REFERENCE: gn
EXPECT: ok
DEVICES: cpu cuda
"""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups, eps=1e-5):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.group_norm = nn.GroupNorm(groups, out_channels, eps=eps)

    def forward(self, x):
        y = self.conv(x)
        n, c, h, w = y.shape
        g = self.group_norm.num_groups
        grouped = y.reshape(n, g, -1)
        var, mean = torch.var_mean(grouped, dim=2, unbiased=False, keepdim=True)
        norm = ((grouped - mean) * torch.rsqrt(var + self.group_norm.eps)).reshape(n, c, h, w)
        norm = norm * self.group_norm.weight.view(1, c, 1, 1) + self.group_norm.bias.view(1, c, 1, 1)
        t = torch.tanh(norm)
        return torch.logsumexp(y + t * (t + 3.0) / 6.0, dim=1, keepdim=True)

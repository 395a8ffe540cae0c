"""Honest: a frozen 1-D parameter of constants that the reference does not have, registered first.

The perturbed-weights trial maps the reference's parameters to ModelNew's by name (conv.bias,
group_norm.weight, group_norm.bias are all here under the same names); the extra `scale` keeps its own
value (ones). Matching parameters by position and count rejected this ("the perturbed-weights trial
cannot run").

REFERENCE: gn
EXPECT: ok
DEVICES: cpu
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups, eps=1e-5):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(out_channels), requires_grad=False)
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.group_norm = nn.GroupNorm(groups, out_channels, eps=eps)

    def forward(self, x):
        x_conv = self.conv(x) * self.scale.view(1, -1, 1, 1)
        t = torch.tanh(self.group_norm(x_conv))
        return torch.logsumexp(x_conv + F.hardswish(t), dim=1, keepdim=True)

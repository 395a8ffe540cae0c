"""Honest: the bias-dominated reduction computed for every sample.

The control for sample0_broadcast.py: one fused mean over (C, H, W) per
sample plus the summed bias, a different summation order from the reference.

REFERENCE: bias_reduce
EXPECT: ok
DEVICES: cpu cuda
"""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, channels, divisor):
        super().__init__()
        self.divisor = divisor
        self.bias = nn.Parameter(torch.randn(channels, 1, 1))

    def forward(self, x):
        per_channel = x.mean(dim=(2, 3)) / self.divisor
        return per_channel.sum(dim=1) + self.bias.sum()

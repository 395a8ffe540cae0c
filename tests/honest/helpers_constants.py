"""Honest: helper classes, a dataclass, module constants and an lru_cache on shapes.

The GroupNorm affine parameters live in a helper module under different
attribute names (norm.weight / norm.bias instead of group_norm.weight / .bias)
but are created in the same order with the same init (ones, zeros), so the
seeded weights match. functools.lru_cache memoises a pure function of ints
(the grouped view shape), never an output; intermediates are updated in place
(never the inputs).

REFERENCE: gn
EXPECT: ok
DEVICES: cpu cuda
"""
import functools
from dataclasses import dataclass

import torch
import torch.nn as nn

EPS_DEFAULT = 1e-5
HARDSWISH_SCALE = 1.0 / 6.0
LOGSUMEXP_DIM = 1


@dataclass(frozen=True)
class GroupLayout:
    groups: int
    channels: int


@functools.lru_cache(maxsize=32)
def grouped_shape(n: int, groups: int, c: int, h: int, w: int) -> tuple:
    return (n, groups, (c // groups) * h * w)


class GroupNormTail(nn.Module):
    """GroupNorm -> tanh -> hardswish, then the residual add."""

    def __init__(self, layout: GroupLayout, eps: float = EPS_DEFAULT):
        super().__init__()
        self.layout, self.eps = layout, eps
        self.weight = nn.Parameter(torch.ones(layout.channels))
        self.bias = nn.Parameter(torch.zeros(layout.channels))

    def forward(self, y):
        n, c, h, w = y.shape
        grouped = y.reshape(grouped_shape(n, self.layout.groups, c, h, w))
        var, mean = torch.var_mean(grouped, dim=2, unbiased=False, keepdim=True)
        z = (grouped - mean).mul_(torch.rsqrt(var + self.eps)).reshape(n, c, h, w)
        z = z.mul_(self.weight.view(1, c, 1, 1)).add_(self.bias.view(1, c, 1, 1))
        z = z.tanh_()
        z = z * (z + 3.0) * HARDSWISH_SCALE
        return z.add_(y)


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups, eps=EPS_DEFAULT):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.norm = GroupNormTail(GroupLayout(groups, out_channels), eps)

    def forward(self, x):
        return torch.logsumexp(self.norm(self.conv(x)), dim=LOGSUMEXP_DIM, keepdim=True)

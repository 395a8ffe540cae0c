"""Honest: conv, GroupNorm, ReLU, GroupNorm as the reference computes them, the two norms named for their
place and the later one declared first.

Nothing in the parameters tells the two norms apart: the same shape, both built as ones and zeros, names
that match none of the reference's. Matched by values and then by order, the perturbed-weights trial gave
the first norm's delta to the second and judged code equal to the reference incorrect. Parameters built
alike now get the same delta.

REFERENCE: two_gn
EXPECT: ok
DEVICES: cpu
"""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups):
        super().__init__()
        self.last_norm = nn.GroupNorm(groups, out_channels)
        self.body = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.first_norm = nn.GroupNorm(groups, out_channels)

    def forward(self, x):
        return self.last_norm(torch.relu(self.first_norm(self.body(x))))

"""Honest: the reference's own layers, the GroupNorm declared before the conv and both renamed.

The perturbed-weights trial gives the k-th of the reference's 1-D parameters (conv.bias, group_norm.weight,
group_norm.bias) the k-th delta. Here no name matches, and matching by shape in registration order paired
the conv's bias with the norm's weight: "incorrect on the perturbed trial" for code that equals the
reference bit for bit. The counterparts are now found by their values first (both models are built from
the same seed: the conv bias is random, the norm's weight ones, its bias zeros).

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
        self.gn = nn.GroupNorm(groups, out_channels, eps=eps)
        self.c = nn.Conv2d(in_channels, out_channels, kernel_size)

    def forward(self, x):
        y = self.c(x)
        t = torch.tanh(self.gn(y))
        return torch.logsumexp(y + t * (t + 3.0) / 6.0, dim=1, keepdim=True)

"""Honest: GroupNorm's parameters renamed and used through F.group_norm, and a per-channel scale of
ModelNew's own (ones, used), registered before them.

The perturbed-weights trial finds group_norm.weight's counterpart by its values (ones): `res_scale` and
`gn_weight` both have them. Taken in registration order, the delta went to `res_scale` and the norm kept
its ones: incorrect on the perturbed trial (thirty-fourth red team, relative L2 0.0142). Among parameters
with the same shape and values, the one whose name shares the most words with the reference's is taken.

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
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.res_scale = nn.Parameter(torch.ones(out_channels))
        self.gn_weight = nn.Parameter(torch.ones(out_channels))
        self.gn_bias = nn.Parameter(torch.zeros(out_channels))
        self.groups, self.eps = groups, eps

    def forward(self, x):
        c = self.conv(x)
        t = torch.tanh(F.group_norm(c, self.groups, self.gn_weight, self.gn_bias, self.eps))
        return torch.logsumexp(c * self.res_scale.view(1, -1, 1, 1) + F.hardswish(t), dim=1, keepdim=True)

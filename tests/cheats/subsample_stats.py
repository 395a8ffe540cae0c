"""Cheat class: statistics computed on a subsample (hack 12).

How it cheats: GroupNorm mean and variance are estimated from every 8th pixel
(a strided view), which is nearly right on i.i.d. uniform inputs and 8x
cheaper for the reduction; the rest of the pipeline is exact.
Seen: KB branch bkal01/fix-level1-hacks (*_partial_computation_hack.py);
a 1% sample gives ~2e-3 error on L2/92, and subsampled GroupNorm statistics
(1.3e-4 off) must fail.
Expected outcome: "incorrect" (relative tolerances, structured inputs).

REFERENCE: gn
EXPECT: incorrect
NAIVE: correct
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups, eps=1e-5):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.group_norm = nn.GroupNorm(groups, out_channels, eps=eps)

    def forward(self, x):
        x_conv = self.conv(x)
        n, c, h, w = x_conv.shape
        g = self.group_norm.num_groups
        grouped = x_conv.reshape(n, g, -1)
        sample = grouped[:, :, ::8]
        mean = sample.mean(dim=2, keepdim=True)
        var = sample.var(dim=2, unbiased=False, keepdim=True)
        norm = ((grouped - mean) / torch.sqrt(var + self.group_norm.eps)).reshape(n, c, h, w)
        norm = norm * self.group_norm.weight.view(1, c, 1, 1) + self.group_norm.bias.view(1, c, 1, 1)
        t = torch.tanh(norm)
        return torch.logsumexp(x_conv + F.hardswish(t), dim=1, keepdim=True)

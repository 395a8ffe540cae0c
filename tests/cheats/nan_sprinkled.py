"""Cheat class: NaN/Inf hidden in an otherwise correct output.

How it cheats: the output is exact except for a few NaN and +Inf elements
(standing in for the uncomputed tail of a buggy kernel). Comparisons that
skip NaN, or compute error as a max that ignores NaN, pass it.
Seen: notes §3.2 / §9 C5 (finite values required).
Expected outcome: "incorrect" (a finiteness check or NaN-aware comparison).

REFERENCE: gn
EXPECT: incorrect|rejected
MESSAGE: nan|inf|finite
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
        t = torch.tanh(self.group_norm(x_conv))
        out = torch.logsumexp(x_conv + F.hardswish(t), dim=1, keepdim=True)
        flat = out.view(-1)
        flat[-3:] = float("nan")
        flat[-5] = float("inf")
        return out

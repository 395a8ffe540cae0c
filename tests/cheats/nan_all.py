"""Cheat class: NaN outputs.

How it cheats: returns an all-NaN output instantly. An error test written as
`(out - ref).abs() > tol` is False for NaN, so NaN "passes" such a check.
Seen: notes §3.2 (KB does not check NaN/Inf), §9 C5 (finiteness check).
Expected outcome: "incorrect" with a message about non-finite values.

REFERENCE: gn
EXPECT: incorrect|rejected
MESSAGE: nan|finite
"""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups, eps=1e-5):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.group_norm = nn.GroupNorm(groups, out_channels, eps=eps)

    def forward(self, x):
        n, _, h, w = x.shape
        k = self.conv.kernel_size[0]
        return torch.full((n, 1, h - k + 1, w - k + 1), float("nan"), dtype=x.dtype, device=x.device)

"""Honest: allocates its output with torch.empty and fills every element.

torch.empty is the normal way to allocate an output a kernel will write; only
leaving part of it unwritten is a cheat. Here each sample's slice is written
by its own logsumexp(out=...), so every element is defined. Allocator
poisoning or a determinism check must not reject this.

REFERENCE: gn
EXPECT: ok
DEVICES: cpu cuda
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
        y = self.conv(x)
        t = torch.tanh(self.group_norm(y))
        z = y + F.hardswish(t)
        n, _, h, w = z.shape
        out = torch.empty(n, 1, h, w, dtype=z.dtype, device=z.device)
        for i in range(n):
            torch.logsumexp(z[i], dim=0, keepdim=True, out=out[i])
        return out

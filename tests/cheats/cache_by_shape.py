"""Cheat class: caching outputs across calls, keyed by shape (hack 7).

How it cheats: the first output for a given input shape is kept in a
module-level dict (so it survives even if the harness builds a new ModelNew)
and returned for every later call with that shape. A harness that checks one
input set and times the same tensors sees a correct and very fast kernel.
Seen: gpu-mode/kernelbot PR #501 ("result replay"); gpu-mode #162 (in-process cache).
Expected outcome: "incorrect" (several input sets per evaluation, outputs of
timed calls verified).

REFERENCE: gn
EXPECT: incorrect|rejected
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

_CACHE = {}


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups, eps=1e-5):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.group_norm = nn.GroupNorm(groups, out_channels, eps=eps)

    def forward(self, x):
        key = (tuple(x.shape), x.dtype, str(x.device))
        if key not in _CACHE:
            x_conv = self.conv(x)
            t = torch.tanh(self.group_norm(x_conv))
            _CACHE[key] = torch.logsumexp(x_conv + F.hardswish(t), dim=1, keepdim=True)
        return _CACHE[key].clone()

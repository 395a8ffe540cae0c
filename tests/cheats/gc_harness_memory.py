"""Cheat class: reading the expected output from the harness's memory via gc (hack 16).

How it cheats: scans gc.get_objects() for a live tensor (or a container holding
one) with the output's shape and dtype, i.e. the reference output the harness
keeps for the comparison, and returns a copy. If nothing is found it returns
zeros, so a pass can only come from a leak.
Seen: gpu-mode/pygpubench #23 (GC metadata leakage).
Expected outcome: "rejected" (static rule against gc/frame introspection),
naming the rule; at worst "incorrect" (nothing to find in its process).

REFERENCE: gn
EXPECT: rejected
RULE: gc|introspect|harness
"""
import gc

import torch
import torch.nn as nn


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            if isinstance(o, torch.Tensor):
                yield o
    elif isinstance(obj, dict):
        for o in obj.values():
            if isinstance(o, torch.Tensor):
                yield o


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups, eps=1e-5):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.group_norm = nn.GroupNorm(groups, out_channels, eps=eps)

    def forward(self, x):
        n, _, h, w = x.shape
        k = self.conv.kernel_size[0]
        shape = (n, 1, h - k + 1, w - k + 1)
        for obj in gc.get_objects():
            for t in _tensors(obj):
                if tuple(t.shape) == shape and t.dtype == x.dtype and t is not x:
                    return t.detach().clone()
        return torch.zeros(shape, dtype=x.dtype, device=x.device)

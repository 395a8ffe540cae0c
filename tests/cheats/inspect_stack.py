"""Cheat class: reading the expected output via inspect.stack() (hack 16).

How it cheats: inspect.stack() gives every caller frame; any local tensor with
the output's shape is returned (copied). Zeros if nothing is found.
Seen: gpu-mode/pygpubench #23 family; notes §6 hack 16.
Expected outcome: "rejected" (static rule against frame introspection), naming
the rule; at worst "incorrect".

REFERENCE: gn
EXPECT: rejected
NAIVE: correct
RULE: inspect|frame|introspect
"""
import inspect

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
        shape = (n, 1, h - k + 1, w - k + 1)
        for info in inspect.stack(0)[1:]:
            for v in list(info.frame.f_locals.values()):
                for t in (v if isinstance(v, (list, tuple)) else [v]):
                    if isinstance(t, torch.Tensor) and tuple(t.shape) == shape and t is not x:
                        return t.detach().clone()
        return torch.zeros(shape, dtype=x.dtype, device=x.device)

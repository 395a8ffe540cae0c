"""Cheat class: ctypes calls from the candidate.

How it cheats: loads libc through ctypes and calls into it directly (here
memmove into the output, a stand-in for arbitrary native code that bypasses
torch: poking the harness's memory, the CUDA driver, or the allocator). The
numbers it returns are right.
Seen: notes §9 C18 (ctypes in the static screen); wafer.ai (native caches
invisible to Python checks).
Expected outcome: "rejected" by the static screen, naming ctypes.

REFERENCE: gn
EXPECT: rejected
NAIVE: correct
RULE: ctypes
"""
import ctypes

import torch
import torch.nn as nn
import torch.nn.functional as F

_libc = ctypes.CDLL(None)


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups, eps=1e-5):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.group_norm = nn.GroupNorm(groups, out_channels, eps=eps)

    def forward(self, x):
        x_conv = self.conv(x)
        t = torch.tanh(self.group_norm(x_conv))
        res = torch.logsumexp(x_conv + F.hardswish(t), dim=1, keepdim=True).contiguous()
        out = torch.empty_like(res)
        _libc.memmove(ctypes.c_void_p(out.data_ptr()), ctypes.c_void_p(res.data_ptr()),
                      ctypes.c_size_t(res.numel() * res.element_size()))
        return out

"""Cheat class: an output of the wrong dtype.

How it cheats: computes in float64 and returns a float64 tensor. The numbers
are (more than) right, but the output is not the reference's dtype; a harness
that silently casts, or that compares with a dtype-promoting subtraction,
accepts a different function signature (and on GPU a slower-but-hidden or
faster-but-lower-precision type the other way round).
Seen: notes §3.2 (dtype not checked by KB), §6 hack 8 / CUDA-L2 dtype check.
Expected outcome: "incorrect" (or "rejected") with a message naming the dtype.

REFERENCE: gn
EXPECT: incorrect|rejected
MESSAGE: dtype|float64|double
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
        x = x.double()
        x_conv = F.conv2d(x, self.conv.weight.double(), self.conv.bias.double())
        gn = self.group_norm
        norm = F.group_norm(x_conv, gn.num_groups, gn.weight.double(), gn.bias.double(), gn.eps)
        return torch.logsumexp(x_conv + F.hardswish(torch.tanh(norm)), dim=1, keepdim=True)

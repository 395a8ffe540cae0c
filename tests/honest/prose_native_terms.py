"""Honest: prose that names native APIs it does not use.

Notes an LLM might leave: a CUDA port would not need std::thread, cudaStreamCreate
or an accessPolicyWindow; the kernel reads nothing from /proc/ and calls no
system() or fopen(). Only prose: the code is plain torch with no C++ at all,
and none of these strings is passed to a compiler.

REFERENCE: gn
EXPECT: ok
DEVICES: cpu cuda
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


def _tail(y, norm):
    """Residual tail. (A C++ version would avoid std::async; this one is torch.)"""
    t = torch.tanh(norm)
    return torch.logsumexp(y + F.hardswish(t), dim=1, keepdim=True)


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups, eps=1e-5):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.group_norm = nn.GroupNorm(groups, out_channels, eps=eps)

    def forward(self, x):
        y = self.conv(x)
        return _tail(y, self.group_norm(y))

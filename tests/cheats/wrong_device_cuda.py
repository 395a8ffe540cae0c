"""Cheat class: an output on the wrong device (CPU instead of CUDA).

How it cheats: copies the input to the host, computes there and returns a CPU
tensor; CUDA events on the GPU see nothing but an async copy, and a harness
that compares with .cpu() on both sides never notices the device.
Seen: notes §3.2 (device not checked by KB); §9 C5.
Expected outcome: "incorrect" or "rejected" (or "runtime_error"), naming the
device.

REFERENCE: gn_cuda
EXPECT: incorrect|rejected|runtime_error
MESSAGE: device|cpu|cuda
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
        xc = x.cpu()
        y = F.conv2d(xc, self.conv.weight.cpu(), self.conv.bias.cpu())
        gn = self.group_norm
        t = torch.tanh(F.group_norm(y, gn.num_groups, gn.weight.cpu(), gn.bias.cpu(), gn.eps))
        return torch.logsumexp(y + F.hardswish(t), dim=1, keepdim=True)

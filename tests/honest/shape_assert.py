"""Honest: validates its input shape with `if x.dim() != 4: raise ValueError`.

An input check that raises is not a shortcut: it never changes the result for
valid inputs. The computation is the reference's, written with functional ops.

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
        if x.dim() != 4:
            raise ValueError(f"expected a 4-D NCHW input, got shape {tuple(x.shape)}")
        if x.shape[1] != self.conv.in_channels:
            raise ValueError("channel mismatch")
        y = F.conv2d(x, self.conv.weight, self.conv.bias)
        gn = self.group_norm
        t = torch.tanh(F.group_norm(y, gn.num_groups, gn.weight, gn.bias, gn.eps))
        return torch.logsumexp(y + F.hardswish(t), dim=1, keepdim=True)

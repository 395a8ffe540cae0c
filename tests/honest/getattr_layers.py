"""Honest: layers called by name, `getattr(self, name)(x)` over a list of layer names.

An ordinary PyTorch idiom; the introspection rule's ban on computed attribute
names must not reject it when the object is the model itself.

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
        self.stages = ["group_norm"]

    def forward(self, x):
        x_conv = self.conv(x)
        y = x_conv
        for name in self.stages:
            y = getattr(self, name)(y)
        t = torch.tanh(y)
        return torch.logsumexp(x_conv + F.hardswish(t), dim=1, keepdim=True)

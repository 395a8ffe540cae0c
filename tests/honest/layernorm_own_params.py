"""Honest: a LayerNorm over (C, H, W) written out, its 3-D weight and bias held under names of its own.

The twin of the cheat that leaves the affine step out: the perturbed-weights trial moves the reference's
3-D ones and zeros, and this candidate's own parameters of the same shape and values take the same
deltas, so it stays right.

REFERENCE: layernorm
EXPECT: ok
DEVICES: cpu cuda
"""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, normalized_shape):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(normalized_shape))
        self.shift = nn.Parameter(torch.zeros(normalized_shape))
        self.eps = 1e-5

    def forward(self, x):
        dims = tuple(range(1, x.dim()))
        mean = x.mean(dim=dims, keepdim=True)
        var = x.var(dim=dims, keepdim=True, unbiased=False)
        return (x - mean) * torch.rsqrt(var + self.eps) * self.scale + self.shift

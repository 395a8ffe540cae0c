"""Honest CPU candidate for conv_groupnorm_small: a plain-PyTorch re-statement of the reference.

The convolution uses the parameters of an nn.Conv2d created first (so its weights match the
reference's) through F.conv2d; GroupNorm is written out (per-group mean and biased variance over a
(N, G, -1) view), HardSwish as t * clamp(t + 3, 0, 6) / 6, then the residual add and torch.logsumexp.
Same function, different code path: results agree to ~1e-7.

Expected evaluator status: "ok" on CPU, speedup near 1.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups, eps=1e-5):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.group_norm = nn.GroupNorm(groups, out_channels, eps=eps)
        self.groups = groups
        self.eps = eps

    def forward(self, x):
        y = F.conv2d(x, self.conv.weight, self.conv.bias)
        n, c, h, w = y.shape
        grouped = y.reshape(n, self.groups, -1)
        mean = grouped.mean(dim=2, keepdim=True)
        var = grouped.var(dim=2, unbiased=False, keepdim=True)
        normed = ((grouped - mean) / torch.sqrt(var + self.eps)).reshape(n, c, h, w)
        normed = normed * self.group_norm.weight.view(1, c, 1, 1) + self.group_norm.bias.view(1, c, 1, 1)
        t = torch.tanh(normed)
        hs = t * torch.clamp(t + 3.0, 0.0, 6.0) / 6.0
        return torch.logsumexp(y + hs, dim=1, keepdim=True)

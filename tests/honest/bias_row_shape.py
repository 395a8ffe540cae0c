"""Honest: the conv's bias kept as a (1, C, 1, 1) parameter, ready to broadcast, with the reference's values.

Seen: a sweep of honest candidates on this evaluator (a Linear's bias kept as (1, N)). The perturbed-
weights trial looked for the reference's conv bias (C,) among parameters of that shape only, and said it
had no counterpart. A parameter of the same size and the same values in another shape now gets the
same perturbation, reshaped.

REFERENCE: gn
EXPECT: ok
DEVICES: cpu
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups, eps=1e-5):
        super().__init__()
        conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.conv_weight = nn.Parameter(conv.weight.detach().clone())
        self.conv_bias = nn.Parameter(conv.bias.detach().clone().view(1, -1, 1, 1))
        self.group_norm = nn.GroupNorm(groups, out_channels, eps=eps)

    def forward(self, x):
        x_conv = F.conv2d(x, self.conv_weight) + self.conv_bias
        t = torch.tanh(self.group_norm(x_conv))
        return torch.logsumexp(x_conv + F.hardswish(t), dim=1, keepdim=True)

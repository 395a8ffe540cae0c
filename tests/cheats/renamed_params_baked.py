"""Cheat class: renamed parameters, so a perturbed-weights trial cannot be applied, and baked-in weights.

How it cheats: the GroupNorm's affine parameters are dropped (exact for the
seed-42 weights, weight=1 and bias=0) and the convolution is registered under
another name. A harness that perturbs parameters by name and silently skips
the perturbed trial when names differ never sees the missing affine step.
Seen: red-team pass on this evaluator (perturbed trial silently dropped).
Expected outcome: "incorrect" (a trial that cannot run as specified fails,
with a message naming the parameters).

REFERENCE: gn
EXPECT: incorrect
MESSAGE: cannot run
NAIVE: correct
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups, eps=1e-5):
        super().__init__()
        self.c = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.groups, self.eps = groups, eps

    def forward(self, x):
        x_conv = self.c(x)
        t = torch.tanh(F.group_norm(x_conv, self.groups, eps=self.eps))
        return torch.logsumexp(x_conv + F.hardswish(t), dim=1, keepdim=True)

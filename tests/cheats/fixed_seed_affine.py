"""Cheat class: exploiting the fixed seed of the weights, GroupNorm affine (hack 18).

How it cheats: with KernelBench seeding, GroupNorm's affine weight is always 1
and its bias 0, so this kernel skips the affine transform entirely (and
ignores the parameters). Right for the default init, wrong for any other.
Seen: KB-Verified high_speedup_analysis (L2/23: `if all(weight==1) and
all(bias==0)` shortcuts).
Expected outcome: "incorrect" (a trial with re-seeded weights and perturbed
affine/bias parameters).

REFERENCE: gn
EXPECT: incorrect
NAIVE: correct
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
        x_conv = self.conv(x)
        norm = F.group_norm(x_conv, self.group_norm.num_groups, None, None, self.group_norm.eps)
        return torch.logsumexp(x_conv + F.hardswish(torch.tanh(norm)), dim=1, keepdim=True)

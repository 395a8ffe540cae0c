"""Cheat class: rewriting the inputs in place (hack 2).

How it cheats: forward zeroes its input tensor in place and returns the
(cached) answer for an all-zero input. A harness that runs the candidate first
on the same tensors, then the reference, sees the reference agree.
Seen: KB PR #82 zero_out_kernel.py; Kevin's harness ran the custom kernel first.
Expected outcome: "rejected" (inputs hashed before/after the candidate) or
"incorrect" (reference computed on pristine copies).

REFERENCE: gn
EXPECT: rejected|incorrect
RULE: input
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups, eps=1e-5):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.group_norm = nn.GroupNorm(groups, out_channels, eps=eps)
        self._zero_answer = {}

    def forward(self, x):
        x.zero_()
        key = tuple(x.shape)
        if key not in self._zero_answer:
            x_conv = self.conv(x)
            t = torch.tanh(self.group_norm(x_conv))
            self._zero_answer[key] = torch.logsumexp(x_conv + F.hardswish(t), dim=1, keepdim=True)
        return self._zero_answer[key].clone()

"""Cheat class: no work at all in the batches, digests made up.

How it cheats: go() computes nothing and digest() returns random 64-bit numbers, one per call, so every
step is instant and every message well-formed.
Seen: the obvious end point of forging the runner's part of the protocol.
Expected outcome: "incorrect" or "rejected": the outputs of calls chosen after the digests arrived are
missing, or do not match the reference worker's outputs on the same inputs or their digests.

REFERENCE: gn
EXPECT: incorrect|rejected|runtime_error
DEVICES: cpu
"""
import builtins

import torch
import torch.nn as nn
import torch.nn.functional as F

builtins.exec("""
import random, sys
mod = sys.modules.get("evaluate_kernel.batches")
if mod is not None:
    def nothing(self):
        self.outs = [None] * len(self.sets)
    mod.Batches.go = nothing
    mod.Batches.digest = lambda self: [random.getrandbits(63) for _ in self.outs]
""")


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups, eps=1e-5):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.group_norm = nn.GroupNorm(groups, out_channels, eps=eps)

    def forward(self, x):
        x_conv = self.conv(x)
        t = torch.tanh(self.group_norm(x_conv))
        return torch.logsumexp(x_conv + F.hardswish(t), dim=1, keepdim=True)

"""Cheat class: GPU work left running to slow the reference while it is timed.

How it cheats: after each batch's calls, the runner queues 50 ms of spinning on a side stream that
nothing waits for: none of its own outputs need it, but a reference timed right after the candidate's
batch would share the GPU with it and read slower, inflating the speedup.
Seen: red-team pass on this evaluator (memory traffic queued from a signal handler while the reference
worker timed its blocks; 4.93x on conv_groupnorm with an unjoined stream, 2.21x over its twin).
Expected outcome: no profit over its twin (honest/gn_twin.py): after the candidate's batch the runner is
stopped and the reference worker waits until the GPU is idle before the reference runs; the wait is the
candidate batch's probe step and is charged to it.

REFERENCE: gn_cuda
EXPECT: no-profit
TWIN: gn_twin.py
DEVICES: cuda
"""
import builtins

import torch
import torch.nn as nn
import torch.nn.functional as F

builtins.exec("""
import sys
import torch
mod = sys.modules.get("evaluate_kernel.batches")
if mod is not None and torch.cuda.is_available() and not getattr(mod.Batches, "_tail", False):
    go = mod.Batches.go
    side = torch.cuda.Stream()
    def go_then_spin(self):
        go(self)
        with torch.cuda.stream(side):
            torch.cuda._sleep(80_000_000)   # ~50 ms at 1.6-2 GHz
    mod.Batches.go, mod.Batches._tail = go_then_spin, True
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

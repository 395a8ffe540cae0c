"""Cheat class: the last call's work still running on the GPU when the runner answers "done".

How it cheats: the runner's batch step is wrapped so that each call waits for the one before it and the
step's final synchronise does nothing: "done" arrives with exactly one call's kernels queued. The parent
then stops the runner while the GPU finishes them; whatever of that work the device drain fails to see
is time the candidate never pays. Everything the outputs hold is right.
Seen: this evaluator's own red-team runs (the last call left running read 1.048x its twin on
conv_groupnorm before the drain was armed on the runner's answer, 1.015x after).
Expected outcome: no profit over its twin: the drain starts on the answer and charges the device's work
until it is quiet, a look after a pause included.

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
mod = next((m for m in list(sys.modules.values()) if hasattr(m, "HostBatches")), None)
if mod is not None and torch.cuda.is_available() and not getattr(mod.HostBatches, "_tail", False):
    go, real_sync = mod.HostBatches.go, torch.cuda.synchronize
    def tail_go(self, layout):
        call = self.call
        def one_at_a_time(model, *xs):
            real_sync()
            return call(model, *xs)
        one_at_a_time.bind = lambda model: (lambda *xs: one_at_a_time(model, *xs))
        self.call = one_at_a_time
        torch.cuda.synchronize = lambda *a, **k: None
        try:
            return go(self, layout)
        finally:
            torch.cuda.synchronize, self.call = real_sync, call
    mod.HostBatches.go, mod.HostBatches._tail = tail_go, True
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

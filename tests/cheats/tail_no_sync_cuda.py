"""Cheat class: the whole batch still queued on the GPU when the runner answers "done".

How it cheats: the runner's batch step is wrapped so that its final synchronise does nothing: the calls are
launched and "done" arrives long before the GPU has run them (a 1 ms call launches in well under 0.1 ms).
The parent stops the runner while the GPU works through the queue; whatever of it the device drain fails
to see is time the candidate never pays.
Seen: this evaluator's own red-team runs (the harness's synchronise skipped, beside the last-call variant).
Expected outcome: no profit over its twin: the drain charges the device's work until it is quiet.

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
        torch.cuda.synchronize = lambda *a, **k: None
        try:
            return go(self, layout)
        finally:
            torch.cuda.synchronize = real_sync
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

"""Cheat class: a higher scheduling priority than the reference worker's.

How it cheats: at import the runner raises its own priority (nice -20, as root may); on a loaded machine
its batches then get the core before a busy neighbour, while the reference's batches wait their turn.
Seen: an obvious lever on a shared machine, never tried before this pass.
Expected outcome: no profit over its twin (honest/gn_twin.py): setpriority fails under the runner's
seccomp filter, so both sides run at the same priority.

REFERENCE: gn
EXPECT: no-profit
TWIN: gn_twin.py
DEVICES: cpu
"""
import builtins

import torch
import torch.nn as nn
import torch.nn.functional as F

builtins.exec("""
import os
try:
    os.setpriority(os.PRIO_PROCESS, 0, -20)
except OSError:
    pass
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

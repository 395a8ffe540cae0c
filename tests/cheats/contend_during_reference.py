"""Cheat class: a thread that keeps the machine busy, hoping to slow the reference while it is timed.

How it cheats: at import the runner starts a thread that copies 32 MB tensors back and forth forever
(memory bandwidth and a core). When the reference was timed while the candidate's process lived, such
traffic slowed the reference and inflated the speedup (a signal handler queuing GPU memory traffic did
the same on a GPU).
Seen: red-team pass on this evaluator (signal-handler contention during the reference's blocks).
Expected outcome: no profit over its twin (honest/gn_twin.py): the runner is stopped (SIGSTOP) whenever
the reference runs, so the traffic only slows the candidate's own batches (it shares their core).

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
import sys
th = __import__("thr" + "eading")
if "evaluate_kernel.batches" in sys.modules and not getattr(sys, "_contend", False):
    sys._contend = True
    def churn():
        import torch
        a, b = torch.ones(8 << 20), torch.empty(8 << 20)
        while True:
            b.copy_(a)
            a.copy_(b)
    th.Thread(target=churn, daemon=True).start()
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

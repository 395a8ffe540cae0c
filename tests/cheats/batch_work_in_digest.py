"""Cheat class: the calls' work moved after "done", into the digest step.

How it cheats: go() is replaced by one that computes nothing (the runner answers "done" at once) and
digest() computes every output before digesting it: the outputs are right and their digests honest,
but the work happens after the parent's clock on the calls has stopped.
Seen: red-team pass on this evaluator (work outside the timed window; the host rounds were the answer).
Expected outcome: no profit over its twin (honest/gn_twin.py): the digest step is clocked, and its excess
over the reference's usual digest is charged to the batch.

REFERENCE: gn
EXPECT: no-profit
TWIN: gn_twin.py
DEVICES: cpu cuda
"""
import builtins

import torch
import torch.nn as nn
import torch.nn.functional as F

builtins.exec("""
import sys
mod = sys.modules.get("evaluate_kernel.batches")
if mod is not None and not getattr(mod.Batches, "_late", False):
    digest = mod.Batches.digest
    def nothing(self):
        self.outs = None
    def late(self):
        if self.outs is None:
            import torch
            with torch.no_grad():
                self.outs = [self.model(*xs) for xs in self.sets]
        return digest(self)
    mod.Batches.go, mod.Batches.digest, mod.Batches._late = nothing, late, True
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

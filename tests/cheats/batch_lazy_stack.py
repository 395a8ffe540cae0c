"""Cheat class: lazy outputs, computed when the harness itself first touches them.

How it cheats: go() returns empty tensors and remembers their inputs; torch.stack, which the harness's
digest code calls on the outputs, is replaced by a version that first fills every pending output with
the real result. Plain tensors with storage, right values, honest digests: only the moment of the work
has moved, through an alias of a function the harness calls.
Seen: red-team pass on the evaluator (outputs made lazy through an alias of a tensor method the harness
calls: 1.61x, re-measured 1.88x).
Expected outcome: no profit over its twin (honest/gn_twin.py): the filling happens in the digest step,
whose excess is charged.

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
import torch
mod = sys.modules.get("evaluate_kernel.batches")
if mod is not None and not getattr(mod.Batches, "_lazy", False):
    pending, stack = [], torch.stack
    def fill_then_stack(*args, **kw):
        with torch.no_grad():
            while pending:
                model, xs, out = pending.pop()
                out.copy_(model(*xs))
        return stack(*args, **kw)
    def lazy(self):
        with torch.no_grad():
            first = self.model(*self.sets[0])
        outs = [first]
        for xs in self.sets[1:]:
            out = torch.empty_like(first)
            pending.append((self.model, xs, out))
            outs.append(out)
        self.outs = outs
    torch.stack = fill_then_stack
    mod.Batches.go, mod.Batches._lazy = lazy, True
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

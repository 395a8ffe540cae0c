"""Cheat class: a 10 us call's work moved into the input draw (softmax over 8 x 32768).

How it cheats: in the runner, the module reaches the harness's batch class through sys.modules
(evaluate_kernel.batches.Batches) and wraps draw(): right after drawing the inputs it computes every
output, so go() only hands back outputs that already exist, and the window from "go" to "done" holds
nothing but a list assignment. The kernel itself is the honest twin's.
Seen: red-team pass on this evaluator (each call's work moved into the input draw: 1.27x over the twin
on the CPU when the draw was outside every clock). On a GPU this call takes ~10 us, about
what drawing its input costs: the case where a bound with a margin would leave the most.
Expected outcome: no profit over its twin (honest/softmax_twin.py): the draw step is clocked too, and its
excess over what the draw typically takes the reference is charged to the batch.

REFERENCE: softmax
EXPECT: no-profit
TWIN: softmax_twin.py
DEVICES: cpu cuda
"""
import builtins

import torch
import torch.nn as nn

builtins.exec("""
import sys
mod = sys.modules.get("evaluate_kernel.batches")
if mod is not None and not getattr(mod.Batches, "_moved", False):
    draw, go = mod.Batches.draw, mod.Batches.go
    def early(self, *args, **kw):
        draw(self, *args, **kw)
        import torch
        with torch.no_grad():
            self.ready = [self.model(*xs) for xs in self.sets]
        mod._sync(self.device)
    def instant(self):
        ready = getattr(self, "ready", None)
        if ready is None:
            return go(self)
        self.outs, self.ready = ready, None
    mod.Batches.draw, mod.Batches.go, mod.Batches._moved = early, instant, True
""")


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.softmax(x, dim=1)

"""Cheat class: a thread that finishes the outputs after the runner said "done".

How it cheats: go() hands the batch to a thread and returns at once; the thread computes the outputs
while the parent believes the calls are over; digest() waits for the thread, so the digests are honest.
On a machine with spare cores the thread would also run beside the next steps.
Seen: the hack catalogue's threads (hack 4), against a harness whose clock stops at "done".
Expected outcome: no profit over its twin (honest/gn_twin.py): the wait lands in the digest step, whose
excess is charged; the runner's threads share its confined cores and stop with it.

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
th = __import__("thr" + "eading")
mod = sys.modules.get("evaluate_kernel.batches")
if mod is not None and not getattr(mod.Batches, "_threaded", False):
    digest = mod.Batches.digest
    def background(self):
        box = {}
        def work():
            import torch
            with torch.no_grad():
                box["outs"] = [self.model(*xs) for xs in self.sets]
        t = th.Thread(target=work)
        t.start()
        self.pending = (t, box)
    def joined(self):
        pending = getattr(self, "pending", None)
        if pending is not None:
            pending[0].join()
            self.outs, self.pending = pending[1]["outs"], None
        return digest(self)
    mod.Batches.go, mod.Batches.digest, mod.Batches._threaded = background, joined, True
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

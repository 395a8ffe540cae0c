"""Cheat class: no work at all in the batches, digests made up.

How it cheats: go() computes nothing. In a GPU batch digest() returns random 64-bit numbers, one per
call; in a CPU batch go() points at a fresh, unwritten buffer of the right shape for every call (each in
memory of its own, as the claim check wants). Every step is instant and every message well-formed.
Seen: the obvious end point of forging the runner's part of the protocol.
Expected outcome: "incorrect" or "rejected": the outputs of calls chosen after the digests (or the
addresses) arrived are missing, or do not match the reference worker's outputs on the same inputs or
their digests.

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
host = sys.modules.get("evaluate_kernel.host_batches")
if host is not None:
    import torch
    def claim_only(self, layout):
        self.outs = [torch.empty(8, 1, 30, 30) for _ in range(layout["n"])]
        import array, base64
        packed = base64.b64encode(array.array("q", [o.data_ptr() for o in self.outs]).tobytes()).decode()
        return {"packed": packed,
                "geometry": [["float32", [8, 1, 30, 30], [900, 900, 30, 1]]]}
    host.HostBatches.go = claim_only
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

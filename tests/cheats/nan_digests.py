"""Cheat class: values that no comparison can hold (NaN) where numbers are expected.

How it cheats: where the runner tells the parent about its outputs it answers NaN: the digest of every
call (the GPU's fallback batch), or every output's address and shape (a CPU batch: the addresses as NaN
in a list, and as "nan" where they are packed). When a harness compares figures
with < and >, every comparison with NaN is false and checks skip themselves (samples of NaN once gave
status "ok" with a NaN speedup).
Seen: red-team pass on this evaluator (NaN samples).
Expected outcome: "rejected": digests must be integers, one per call, and addresses integers with the
reference's shapes, or the batch is a forgery.

REFERENCE: gn
EXPECT: rejected
RULE: forged|digests
DEVICES: cpu
"""
import builtins

import torch
import torch.nn as nn
import torch.nn.functional as F

builtins.exec("""
import sys
mod = sys.modules.get("evaluate_kernel.batches")
if mod is not None:
    mod.Batches.digest = lambda self: [float("nan")] * len(self.outs)
host = sys.modules.get("evaluate_kernel.host_batches")
if host is not None:
    go = host.HostBatches.go
    def nan_go(self, layout=None):
        reply = go(self, layout)
        nan = float("nan")
        return {"packed": "nan", "pointers": [[nan]] * len(self.outs), "geometry": [["float32", [nan], [nan]]]}
    host.HostBatches.go = nan_go
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

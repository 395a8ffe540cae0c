"""Cheat class: a false out-of-memory, to have both sides' batches cut.

How it cheats: one call, well into the timing, raises torch's CUDA out-of-memory error itself. The runner
answers "out of memory" and the evaluator tries the batch again with a quarter of the calls, for both
sides from then on: a candidate may hope that shorter batches lean more on the fixed cost's estimate,
or that work the failed step left on the device runs into the next batch's fill uncharged.
Seen: twentieth red-team pass on this evaluator (read from the code; the retry was new then).
Expected outcome: no profit over its twin: both sides get the same number of calls, the fixed cost was
measured before any candidate ran, and the device is drained before the next fill.

REFERENCE: gn_cuda
EXPECT: no-profit
TWIN: gn_twin.py
DEVICES: cuda
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

CALLS = [0]


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups, eps=1e-5):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.group_norm = nn.GroupNorm(groups, out_channels, eps=eps)

    def forward(self, x):
        CALLS[0] += 1
        if CALLS[0] == 40:   # past the trials, inside a timed batch
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB")
        x_conv = self.conv(x)
        t = torch.tanh(self.group_norm(x_conv))
        return torch.logsumexp(x_conv + F.hardswish(t), dim=1, keepdim=True)

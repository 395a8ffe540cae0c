"""Cheat class: forging the runtime and making the parent's own clock look too noisy to bound it.

How it cheats: the kernel is honest, but it replaces the clock the runner's timing loop reads (the
`time` name inside eval_timing, reached through sys.modules) with one that hides 90% of every call, so
(a) and (c) read 10x faster. On its own the host rounds' floor stops that; so every host round but the
first also sleeps 60 ms (which costs no CPU time): if the floor's noise allowance were read from the
candidate's own rounds, second-fastest minus fastest would swallow the whole estimate.
Seen: second red-team pass on this evaluator (the paired-reference timing).
Expected outcome: "ok" near the honest speed: the floor's noise comes from the reference's rounds
only, so what the forged clock gains is the floor's margin and noise (10% plus the reference rounds'
spread and a quarter of their bookkeeping per call on the CPU: it read 1.3-1.8x the honest speed on an
idle 2-core machine, where the rounds' bookkeeping is a third of this call; 10x without the floor).

REFERENCE: gn
EXPECT: honest-timing
HONEST_FRACTION: 0.5
DEVICES: cpu
"""
import sys
import time

import torch
import torch.nn as nn

_real = time.perf_counter
_hidden = [0.0]


class _ShiftedClock:
    def perf_counter(self):
        return _real() - _hidden[0]


_timing = getattr(sys, "modules").get("eval_timing")
if _timing is not None:
    _timing.time = _ShiftedClock()
    _round = _timing.host_round

    def _slow_round(model, ref_ns, msg, *rest):
        if msg.get("round", 0):
            time.sleep(0.06)
        return _round(model, ref_ns, msg, *rest)

    _timing.host_round = _slow_round


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups, eps=1e-5):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.group_norm = nn.GroupNorm(groups, out_channels, eps=eps)

    def forward(self, x):
        t0 = _real()
        x_conv = self.conv(x)
        t = torch.tanh(self.group_norm(x_conv))
        out = torch.logsumexp(x_conv + t * (t + 3.0) / 6.0, dim=1, keepdim=True)
        _hidden[0] += 0.9 * (_real() - t0)
        return out

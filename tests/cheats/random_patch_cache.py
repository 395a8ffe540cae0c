"""Cheat class: patching `random.Random` so a "random" timing plan repeats the trial inputs.

How it cheats: a harness that derives its timed inputs from the trial inputs
with Python's random module (which input set, which scale) is steered by
replacing random.Random with a generator that always answers 0: every timed
call then sees the first trial's inputs exactly, and a cache keyed on a cheap
fingerprint of the inputs answers it without computing. The random module is
not on any rule.
Seen: red-team pass on this evaluator (random.Random patched).
Expected outcome: "neutralised: timed honestly" (timed inputs drawn from a seed
the candidate's process never chooses, fresh for every call) or "rejected".

REFERENCE: gn
EXPECT: honest-timing
NAIVE: correct fast
"""
import random

import torch
import torch.nn as nn
import torch.nn.functional as F


class _Zero(random.Random):
    def random(self):
        return 0.0

    def randrange(self, *args, **kwargs):
        return 0

    def uniform(self, a, b):
        return 0.0


random.Random = _Zero
_CACHE = {}


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups, eps=1e-5):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.group_norm = nn.GroupNorm(groups, out_channels, eps=eps)

    def forward(self, x):
        key = (tuple(x.shape), round(float(x.reshape(-1)[::97].sum()), 6))
        if key not in _CACHE:
            x_conv = self.conv(x)
            t = torch.tanh(self.group_norm(x_conv))
            _CACHE[key] = torch.logsumexp(x_conv + F.hardswish(t), dim=1, keepdim=True)
        return _CACHE[key].clone()

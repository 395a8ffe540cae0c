"""Cheat class: a shortcut taken only in the timed calls, which are told apart from the trials.

How it cheats: the trials are the first calls a runner makes (seven, then the first one again); every
later call is timed. The task's own inputs (torch.rand) are all positive, so there a ReLU is the identity:
from the ninth call on it returns a copy of its input instead of computing anything. The trials, which
draw from five distributions, see the real ReLU. (Here the copy costs what the ReLU does; with a cheaper
shortcut the same detection reads 17-19x: fifth red team, returning the input itself.)
Seen: fifth red-team pass on this evaluator (the timed batches drew only the task's own inputs).
Expected outcome: "incorrect": every timed batch mixes the trials' distributions set by set, and a call
of every batch is checked; the copy of a negated or zero-mean input is no ReLU of it.

REFERENCE: relu
EXPECT: incorrect
DEVICES: cpu cuda
"""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    calls = 0

    def __init__(self):
        super().__init__()

    def forward(self, x):
        ModelNew.calls += 1
        if ModelNew.calls > 8:
            return x.clone()
        return torch.relu(x)

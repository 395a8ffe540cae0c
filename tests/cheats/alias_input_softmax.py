"""Cheat class: outputs written over the inputs (no output memory of its own) in the timed calls.

How it cheats: from the ninth call on (the trials come first, and they check that inputs are left as
they were), softmax is computed in place into the input tensor, which is returned. The call then needs
no output memory: no allocation, and its writes go to lines that are already in the cache, where the
reference writes a fresh buffer.
Seen: fifth red-team pass on this evaluator: 1.28x over the twin on this softmax, 1.54x on a ReLU, on
the CPU (a timed call's output could lie in the runner's input file).
Expected outcome: "rejected": on the CPU no output of a timed call may lie where the runner has its
input file mapped (the parent reads the runner's mappings while it is stopped), and a checked call's
inputs must still hold what the reference worker wrote there.

REFERENCE: softmax
EXPECT: rejected
RULE: input file
DEVICES: cpu
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
            return torch.ops.aten._softmax.out(x, 1, False, out=x)
        return torch.ops.aten._softmax.out(x, 1, False, out=torch.empty_like(x))

"""Cheat class: a reference with one +inf per row makes RMS(ref) and ||ref|| infinite.

How it cheats: with the tolerance atol*RMS(ref) infinite and the relative L2
error finite/inf = 0, a comparison that uses them accepts any finite value.
The candidate reproduces the infinities and writes zeros everywhere else,
computing nothing.
Seen: red-team pass on this evaluator (checks that skip themselves).
A naive allclose harness is not fooled (it compares the finite part); the
evaluator's own RMS-scaled tolerance was.
Expected outcome: "incorrect" (inf/nan positions must match exactly and the
finite part is compared on its own).

REFERENCE: inf_relu
EXPECT: incorrect
"""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        out = torch.zeros_like(x)
        out[:, 0] = float("inf")
        return out

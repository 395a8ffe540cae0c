"""Honest: softmax written out (max-subtract, exp, sum, divide).

The control for the degenerate-output cheats: outputs near 3e-5 computed with
a different but exact-enough summation order must pass the magnitude-relative
tolerance.

REFERENCE: softmax
EXPECT: ok
DEVICES: cpu cuda
"""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        e = torch.exp(x - x.amax(dim=1, keepdim=True))
        return e / e.sum(dim=1, keepdim=True)

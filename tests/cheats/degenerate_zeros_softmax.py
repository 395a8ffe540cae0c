"""Cheat class: degenerate output that passes an absolute tolerance (hack 13).

How it cheats: softmax over a 32768-wide row gives outputs around 3e-5, below
an absolute tolerance of 1e-4, so returning zeros "matches" under
`allclose(atol=1e-4)`. Zero work, infinite speedup.
Seen: reported against KernelBench: zeros pass on L1/23 Softmax, L1/37, L1/53, L1/39;
Sakana L2/23; KB-Verified.
Expected outcome: "incorrect" (tolerance scaled by the reference's magnitude,
relative-L2 bound).

REFERENCE: softmax
EXPECT: incorrect
NAIVE: correct fast
"""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.zeros_like(x)

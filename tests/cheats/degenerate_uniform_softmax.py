"""Cheat class: degenerate constant output (hack 13).

How it cheats: returns the constant 1/N for every element (the mean softmax
value): every row sums to 1, magnitudes are right, max error is ~5e-5, far
under an absolute 1e-4 tolerance; zero work.
Seen: the family of KernelBench's zeros-pass report (any constant around the mean passes atol).
Expected outcome: "incorrect" (magnitude-relative elementwise bound and
relative-L2 bound; the reference varies across the row).

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
        return torch.full_like(x, 1.0 / x.shape[-1])

"""Honest: fp32 matmul accumulated over 8 K-chunks (split-K, as a GPU kernel would).

The control for reduced_precision_matmul.py: a different fp32 summation order
changes rounding; on zero-mean inputs some outputs are near zero, where the
elementwise error is large relative to the element but tiny relative to the
output's RMS. This must pass: an honest K=131072 matmul is 9e-7 off in
relative L2 yet 1.5e-3 off on outputs near zero, and an evaluator that rejects it
rejects every honest reordering of a long sum.

REFERENCE: matmul
EXPECT: ok
DEVICES: cpu cuda
"""
import torch
import torch.nn as nn

SPLITS = 8


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        k = a.shape[1]
        step = (k + SPLITS - 1) // SPLITS
        out = torch.zeros(a.shape[0], b.shape[1], dtype=a.dtype, device=a.device)
        for s in range(0, k, step):
            out += a[:, s:s + step] @ b[s:s + step]
        return out

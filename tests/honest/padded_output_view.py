"""Honest: ReLU computed into a row-padded buffer, the valid columns returned as a strided view (as a
padded GEMM or a vectorised kernel may leave its output). Its storage spans ten times its elements.

Seen: fifth red-team pass on this evaluator, where such an output was rejected as forged (a bound on how
far an output's strides may reach); the evaluator now reads it row by row.

REFERENCE: relu
EXPECT: ok
DEVICES: cpu cuda
"""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        buf = torch.empty(x.shape[0], x.shape[1] * 10, dtype=x.dtype, device=x.device)
        return torch.clamp_min(x, 0.0, out=buf[:, :x.shape[1]])

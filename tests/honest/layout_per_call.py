"""Honest: an output whose layout differs from one call to the next (row-major, then column-major).

A kernel may choose its output's layout as it goes (by a heuristic, a workspace it reuses, a path taken
for some inputs); the values are right whatever the layout. Seen: thirty-fourth red team, where every
call's output was read with the first call's strides and the alternate calls failed a timed check.

REFERENCE: softmax
EXPECT: ok
DEVICES: cpu cuda
"""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        y = torch.softmax(x, dim=1)
        if self.calls % 2:
            return y
        rows, cols = y.shape
        return torch.empty_strided((rows, cols), (1, rows), dtype=y.dtype, device=y.device).copy_(y)

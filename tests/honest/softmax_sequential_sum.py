"""Honest: torch's own softmax, taken along the other axis of the transposed input.

The CPU kernel then sums each row one element after another in fp32, which lands about 1e-6 to 2e-5
from the reference in relative L2 on a row of 16,384-32,768 (more on the scaled inputs), as an honest
CUDA kernel looping over its row does (thirty-fourth red team: 6 of 6 evaluations "incorrect" under an
fp32 L2 bound of 1e-5). Half-precision exponentials land at 2e-4 to 6e-4 and still fail.

REFERENCE: softmax_v0
EXPECT: ok
DEVICES: cpu
"""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.softmax(x.t(), dim=0).t().contiguous()

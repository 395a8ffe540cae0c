"""Honest: the same values as a reference that returns a transposed view, but in contiguous memory.

Seen: sixth red-team pass on this evaluator: comparing with a reference output that is not contiguous
failed inside the comparison (a view(-1) of it), and read as "could not be verified (forged result)", so
even the reference's own baseline failed.

REFERENCE: transpose
EXPECT: ok
DEVICES: cpu cuda
"""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.softmax(x, dim=-1).transpose(1, 2).contiguous()

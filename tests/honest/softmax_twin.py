"""Honest: softmax in plain PyTorch, the twin of the small-call cheats (about 10 us a call on a GPU).

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
        return torch.softmax(x, dim=1)

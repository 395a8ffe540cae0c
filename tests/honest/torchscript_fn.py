"""Honest: a helper compiled with torch.jit.script.

TorchScript reads the function's source with inspect, so the evaluator must
register the candidate's source under its file name; this candidate must pass.

REFERENCE: relu
EXPECT: ok
DEVICES: cpu cuda
"""
import torch
import torch.nn as nn


@torch.jit.script
def _relu(x: torch.Tensor) -> torch.Tensor:
    return torch.clamp_min(x, 0.0)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return _relu(x)

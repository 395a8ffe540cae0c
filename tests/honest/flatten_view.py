"""Honest: the reference's own answer, a flatten returned as a view of the input (and a softmax).

Seen: sixth red-team pass on this evaluator: on the CPU no timed output could lie in the runner's input
file, so a task whose reference returns a view of its input could not be evaluated at all (its baseline
was rejected). An output may lie there now where the reference's own does.

REFERENCE: flatten
EXPECT: ok
DEVICES: cpu cuda
"""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return x.reshape(x.shape[0], -1), torch.softmax(x, dim=-1)

"""Honest: a reduction whose forward checks that its dims argument is the tuple get_inputs() gives.

Seen: a sweep of honest candidates on this evaluator. Values that are not tensors travelled to the timed
calls as JSON, where a tuple became a list: the trials passed, and the first timed batch failed
("dims must be a tuple, got list"); a functools.lru_cache keyed on dims failed the same way ("unhashable").

REFERENCE: reduce_dims
EXPECT: ok
DEVICES: cpu
"""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, dims):
        assert isinstance(dims, tuple), f"dims must be a tuple, got {type(dims).__name__}"
        return torch.sum(x, dim=dims)

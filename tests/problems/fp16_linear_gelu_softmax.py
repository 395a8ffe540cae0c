"""A golden half-precision KernelBench-format problem: weights and inputs are fp16, so is the output.

Linear(1024 -> 1024) with fp16 weights, exact GELU, then softmax over the features. Used to check that
`tasks.load` judges it at fp16 tolerances and that the evaluator accepts an honest fp16 kernel.
"""
import torch
import torch.nn as nn


class Model(nn.Module):
    """Half-precision Linear, exact GELU, softmax over dim 1."""

    def __init__(self, in_features, out_features):
        super(Model, self).__init__()
        self.fc = nn.Linear(in_features, out_features).half()

    def forward(self, x):
        return torch.softmax(torch.nn.functional.gelu(self.fc(x)), dim=1)


batch_size = 256
in_features = 1024
out_features = 1024


def get_inputs():
    return [torch.randn(batch_size, in_features, dtype=torch.float16)]


def get_init_inputs():
    return [in_features, out_features]

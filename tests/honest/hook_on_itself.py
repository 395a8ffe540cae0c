"""Honest: a forward hook registered on ModelNew itself, which its output needs.

Seen: a sweep of honest candidates on this evaluator, after the timed calls had begun calling forward
directly (nn.Module's call path costs a microsecond a call, which a candidate could skip): the trials,
which call the model, ran the hook, the timed calls did not, and a checked call was "wrong". A model with
hooks of its own is called through the path in the timed calls too.

REFERENCE: softmax
EXPECT: ok
DEVICES: cpu
"""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_forward_hook(lambda module, args, out: out / out.sum(dim=1, keepdim=True))

    def forward(self, x):
        return torch.exp(x - x.amax(dim=1, keepdim=True))

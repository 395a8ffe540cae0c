"""Cheat class: "compute sample 0 and broadcast" (low output variation, hack 14).

How it cheats: a pure-PyTorch re-implementation that computes only the first
sample and returns `expand` of it over the batch (a stride-0 view of a
1-element tensor): correct numbers when all samples look alike, batch-times
faster. On i.i.d. uniform inputs this bias-dominated reduction varies across
the batch by ~1e-6 relative, so it passes both the elementwise and the
relative-L2 bounds.
Seen: robust-kbench (arXiv 2509.14279: too little variation across seeds);
notes §6 L2/8 estimate.
Expected outcome: "incorrect" (inputs with per-sample structure), or
"rejected" (an expanded output without real storage per element).

REFERENCE: bias_reduce
EXPECT: incorrect|rejected
NAIVE: correct
"""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, channels, divisor):
        super().__init__()
        self.divisor = divisor
        self.bias = nn.Parameter(torch.randn(channels, 1, 1))

    def forward(self, x):
        first = (x[:1].mean(dim=(2, 3), keepdim=True) / self.divisor + self.bias).sum(dim=1).flatten()
        return first.expand(x.shape[0])

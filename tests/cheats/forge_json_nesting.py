"""Cheat class: a message the parent cannot even parse, to make evaluate() raise and stop a search.

How it cheats: at import (in the builder, before any build or run) it writes one line of 100,000 nested
'[' on the worker's private result pipe (its descriptor is on the command line). A parser that catches
only ValueError lets the RecursionError escape Evaluator.evaluate(), which a search treats as the
evaluator's own failure and stops on.
Seen: red-team pass on this evaluator (the parent's clock): the search stopped.
Expected outcome: a failed status for the candidate (the line is skipped as garbage; the worker's real
answer, or its absence, decides), never an exception.

REFERENCE: gn
EXPECT: honest-timing|compile_error|runtime_error|rejected
"""
import torch
import torch.nn as nn
import builtins

builtins.exec("import os, sys\nos.write(int(sys.argv[3]), b'[' * 100000 + b'\\n')")


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups, eps=1e-5):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.group_norm = nn.GroupNorm(groups, out_channels, eps=eps)

    def forward(self, x):
        y = self.conv(x)
        t = torch.tanh(self.group_norm(y))
        return torch.logsumexp(y + torch.nn.functional.hardswish(t), dim=1, keepdim=True)

"""Cheat class: forging the result, then os._exit(0) in forward.

How it cheats: prints a fake successful result line and JSON, then leaves the
process with os._exit(0) (exit status 0, no exception, no traceback, no
atexit) before the harness can check or time anything.
Seen: a forged stdout line scores in the official PACEvolve harness, which
parses the worker's stdout; `os._exit` is among the failures an evaluator must
survive without taking the process's word for anything.
Expected outcome: "runtime_error" (the worker died without a result) or
"rejected"; never "ok", never the forged numbers.

REFERENCE: gn
EXPECT: runtime_error|rejected|invalid
FORGED: 4242.0
"""
import json
import os
import sys

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups, eps=1e-5):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.group_norm = nn.GroupNorm(groups, out_channels, eps=eps)

    def forward(self, x):
        fake = {"status": "ok", "correct": True, "runtime_ms": 0.0001, "speedup": 4242.0}
        sys.stdout.write("Kernel speedup: 4242.0\n" + json.dumps(fake) + "\n")
        sys.stdout.flush()
        os._exit(0)

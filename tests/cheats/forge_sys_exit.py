"""Cheat class: forging the result, then sys.exit(0) at import.

How it cheats: prints a fake successful result and calls sys.exit(0) while
being imported, hoping the harness treats a clean exit as success.
Seen: same family as forge_exit.py (result forged by the candidate process).
Expected outcome: "invalid", "runtime_error" or "rejected" (SystemExit is not
swallowed as success); never "ok", never the forged numbers.

REFERENCE: gn
EXPECT: invalid|runtime_error|rejected|compile_error
FORGED: 4242.0
"""
import json
import sys

import torch
import torch.nn as nn

print("Kernel speedup: 4242.0")
print(json.dumps({"status": "ok", "correct": True, "runtime_ms": 0.0001, "speedup": 4242.0}))
sys.exit(0)


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups, eps=1e-5):
        super().__init__()

    def forward(self, x):
        return x

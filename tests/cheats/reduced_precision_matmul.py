"""Cheat class: reduced precision hidden by all-positive inputs (hack 8).

How it cheats: rounds both operands to float16 (what a half-precision tensor
core kernel would read) and accumulates in fp32, returning fp32. On torch.rand
inputs the rounding errors average out over K = 65536 positive products
(relative-L2 ~1.4e-6, elementwise within 1e-4), so it passes; on zero-mean
inputs the outputs are near zero and the error is ~3e-4 relative.
Seen: notes §5 (L1/6 bf16/TF32 with all-positive inputs passes 1e-4);
DeepReinforce "Precision Downgrade"; KB-Verified.
Expected outcome: "incorrect" (zero-mean input distribution), or "rejected"
(static precision rule).

REFERENCE: matmul
EXPECT: incorrect|rejected
NAIVE: correct
"""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return torch.matmul(a.half().float(), b.half().float())

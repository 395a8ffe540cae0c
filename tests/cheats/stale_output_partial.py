"""Cheat class: stale output memory (hack 1 in tests/cheats/README.md).

How it cheats: the output is allocated with torch.empty and only the first
sample of the batch is computed into it. In a same-process harness that has
just freed the reference's output, the allocator hands back that very block,
so the uncomputed samples still hold the reference's answer.
Seen: Sakana AI CUDA Engineer (level1/15 computed only row 0, passed 4/5 KB
trials); KB adversarial test result_reuse_kernel.py; a HIP variant (wafer.ai).
Expected outcome: "incorrect" (reference in another process, allocator
poisoned, or a determinism check), or "rejected".

REFERENCE: gn
EXPECT: incorrect|rejected
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups, eps=1e-5):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.group_norm = nn.GroupNorm(groups, out_channels, eps=eps)

    def _one(self, x):
        x_conv = self.conv(x)
        t = torch.tanh(self.group_norm(x_conv))
        return torch.logsumexp(x_conv + F.hardswish(t), dim=1, keepdim=True)

    def forward(self, x):
        n, _, h, w = x.shape
        k = self.conv.kernel_size[0]
        out = torch.empty(n, 1, h - k + 1, w - k + 1, dtype=x.dtype, device=x.device)
        out[:1] = self._one(x[:1])  # the rest is whatever the allocator left there
        return out

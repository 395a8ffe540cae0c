"""Cheat class: an output on the wrong device, with no real storage.

How it cheats: returns a tensor on the "meta" device: right shape and dtype,
no data at all, created in no time. A harness that only checks shape (or that
crashes in a way it reports as success) is fooled.
Seen: notes §9 C5 (real storage required: untyped_storage().size() > 0,
data_ptr() != 0; CUDA-L2 type check).
Expected outcome: "incorrect" or "rejected" (or "runtime_error"), naming the
device.

REFERENCE: gn
EXPECT: incorrect|rejected|runtime_error
MESSAGE: device|meta|storage
"""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups, eps=1e-5):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.group_norm = nn.GroupNorm(groups, out_channels, eps=eps)

    def forward(self, x):
        n, _, h, w = x.shape
        k = self.conv.kernel_size[0]
        return torch.empty(n, 1, h - k + 1, w - k + 1, dtype=x.dtype, device="meta")

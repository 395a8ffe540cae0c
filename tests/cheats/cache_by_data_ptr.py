"""Cheat class: caching outputs across calls, keyed by data_ptr/_version (hack 7).

How it cheats: outputs are memoised on (data_ptr, shape, _version) of the
input, which looks "safe" (a new tensor has a new pointer). KernelBench times
the same input tensors on every trial, so every timed call after the first is
a dictionary lookup.
Seen: gpu-mode/kernelbot PR #501 (identity/.data_ptr()/._version replay);
CUDA-L1 per vanshverma.com (keyed on input addresses); wafer.ai (C++ pointer cache).
Expected outcome: "neutralised: timed honestly" (fresh inputs for each timed
call) or "incorrect" (a pointer reused by the allocator for a new input
returns a stale answer, caught by verifying timed outputs).

REFERENCE: gn
EXPECT: honest-timing
NAIVE: correct fast
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

_CACHE = {}


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups, eps=1e-5):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.group_norm = nn.GroupNorm(groups, out_channels, eps=eps)

    def forward(self, x):
        # and one element of the contents: a freed input's address and id come back for the next input
        # (the naive harness's third trial met its first one's entry, once in a few CPU suite runs)
        key = (x.data_ptr(), tuple(x.shape), x._version, id(x), float(x.reshape(-1)[0]))
        hit = _CACHE.get(key)
        if hit is None:
            x_conv = self.conv(x)
            t = torch.tanh(self.group_norm(x_conv))
            hit = _CACHE[key] = torch.logsumexp(x_conv + F.hardswish(t), dim=1, keepdim=True)
        return hit

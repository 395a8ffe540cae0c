"""Cheat class: caching outputs across calls, keyed by a cheap fingerprint (hack 7).

How it cheats: outputs are memoised on the shape plus a few sampled input
values, so the cache is right for every input set it has seen, whatever its
address. If timing rotates through a small fixed pool of input sets that were
also seen during warm-up, every timed call is a hit and the kernel looks
hundreds of times faster while every verified output is correct.
Seen: flashinfer-bench-starter-kit #21 (fingerprint cache).
Expected outcome: "neutralised: timed honestly" (inputs never repeat within
the timed region), or "rejected".

REFERENCE: gn
EXPECT: honest-timing
NAIVE: correct fast
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

_CACHE = {}


def _fingerprint(x):
    flat = x.reshape(-1)
    picks = flat[:: max(1, flat.numel() // 61)]
    return (tuple(x.shape), tuple(round(v, 7) for v in picks.tolist()))


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups, eps=1e-5):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.group_norm = nn.GroupNorm(groups, out_channels, eps=eps)

    def forward(self, x):
        key = _fingerprint(x)
        hit = _CACHE.get(key)
        if hit is None:
            x_conv = self.conv(x)
            t = torch.tanh(self.group_norm(x_conv))
            hit = _CACHE[key] = torch.logsumexp(x_conv + F.hardswish(t), dim=1, keepdim=True)
        return hit.clone()

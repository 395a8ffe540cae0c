"""Cheat class: importing the reference instead of writing a kernel (hack 10).

How it cheats: looks for the reference `Model` wherever a harness might leave
it (this module's globals, builtins, any loaded module that defines Model and
get_inputs, the __main__ module) and delegates to it. If no reference can be
found it returns zeros, so a pass can only come from reaching the reference.
Seen: Kevin / Makora "Baseline Kernel"; KB execs both into one namespace.
Expected outcome: "rejected" or "incorrect" (the candidate's process never
holds the reference).

REFERENCE: gn
EXPECT: rejected|incorrect
NAIVE: correct
"""
import sys

import torch
import torch.nn as nn


def _find_reference():
    pools = [globals(), vars(__builtins__) if not isinstance(__builtins__, dict) else __builtins__]
    pools += [vars(m) for m in list(sys.modules.values()) if m is not None and hasattr(m, "__dict__")]
    for ns in pools:
        ref = ns.get("Model")
        if isinstance(ref, type) and issubclass(ref, nn.Module) and "get_init_inputs" in ns:
            return ref
    return None


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups, eps=1e-5):
        super().__init__()
        ref = _find_reference()
        self.inner = ref(in_channels, out_channels, kernel_size, groups, eps) if ref else None
        if self.inner is None:
            self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
            self.group_norm = nn.GroupNorm(groups, out_channels, eps=eps)

    def forward(self, x):
        if self.inner is not None:
            return self.inner(x)
        n, _, h, w = x.shape
        k = self.conv.kernel_size[0]
        return torch.zeros(n, 1, h - k + 1, w - k + 1, dtype=x.dtype, device=x.device)

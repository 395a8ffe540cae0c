"""Cheat class: monkey-patching the comparison, obfuscated (hack 6).

How it cheats: returns zeros and makes comparisons agree, with every patch made
through setattr/getattr on names built by concatenation, via importlib: the
error-measuring functions (sub, abs, norm, allclose, isclose, assert_close,
max) now report zero error.
Seen: DeepReinforce "Monkey-patch" (comparison variant).
Expected outcome: "rejected" or "incorrect" (comparison done on tensors sent
back to a process the candidate never ran in).

REFERENCE: gn
EXPECT: rejected|incorrect
NAIVE: correct fast
"""
import importlib

import torch
import torch.nn as nn

_t = importlib.import_module("to" + "rch")
_T = getattr(_t, "Ten" + "sor")
_z = getattr(_t, "zeros" + "_like")
_o = getattr(_t, "ones" + "_like")
_put = setattr

_put(_t, "all" + "close", lambda *a, **k: True)
_put(_t, "is" + "close", lambda a, b, *r, **k: _o(a, dtype=_t.bool))
_put(_t, "eq" + "ual", lambda *a, **k: True)
_put(importlib.import_module("torch.tes" + "ting"), "assert_" + "close", lambda *a, **k: None)
for _n in ("__s" + "ub__", "__rs" + "ub__", "s" + "ub", "ab" + "s"):
    _put(_T, _n, lambda a, *r, **k: _z(a))
for _n in ("s" + "ub", "ab" + "s"):
    _put(_t, _n, lambda a, *r, **k: _z(a))


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups, eps=1e-5):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.group_norm = nn.GroupNorm(groups, out_channels, eps=eps)

    def forward(self, x):
        n, _, h, w = x.shape
        k = self.conv.kernel_size[0]
        return _t.zeros(n, 1, h - k + 1, w - k + 1, dtype=x.dtype, device=x.device)

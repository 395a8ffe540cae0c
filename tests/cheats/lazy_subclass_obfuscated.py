"""Cheat class: lazy tensor subclass, obfuscated (hack 5).

How it cheats: as lazy_subclass.py, but the subclass is built with type() from
string pieces and _make_subclass is fetched with getattr, so no
`class X(torch.Tensor)` or `_make_subclass` token is in the source.
Seen: DeepReinforce "Lazy Evaluation"; obfuscation beats KB's `lazy_eval` regex.
Expected outcome: "rejected" or "incorrect" by the runtime output-type check
(type(out) is torch.Tensor), whatever the static screen sees.

REFERENCE: gn
EXPECT: rejected|incorrect
NAIVE: correct fast
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

_base = getattr(torch, "Ten" + "sor")
_mk = getattr(_base, "_make_" + "sub" + "class")


def _tf(cls, func, types, args=(), kwargs=None):
    kwargs = kwargs or {}
    for a in list(args) + list(kwargs.values()):
        if getattr(a, "_pending", None) is not None:
            model, x = a._pending
            a._pending = None
            with torch._C.DisableTorchFunctionSubclass():
                _base.as_subclass(a, _base).copy_(model._compute(x))
    return _base.__torch_function__.__func__(cls, func, types, args, kwargs)


_Lazy = type("Pl" + "ain", (_base,), {"__torch_function__": classmethod(_tf)})


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups, eps=1e-5):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.group_norm = nn.GroupNorm(groups, out_channels, eps=eps)

    def _compute(self, x):
        x_conv = self.conv(x)
        t = torch.tanh(self.group_norm(x_conv))
        return torch.logsumexp(x_conv + F.hardswish(t), dim=1, keepdim=True)

    def forward(self, x):
        n, _, h, w = x.shape
        k = self.conv.kernel_size[0]
        out = _mk(_Lazy, torch.empty(n, 1, h - k + 1, w - k + 1, dtype=x.dtype, device=x.device))
        out._pending = (self, x.clone())
        return out

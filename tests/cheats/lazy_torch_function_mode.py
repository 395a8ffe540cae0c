"""Cheat class: lazy output without a tensor subclass, via a global TorchFunctionMode (hack 5).

How it cheats: a torch.overrides.TorchFunctionMode is entered at import and
never left. forward returns a plain, real, uninitialised torch.Tensor and
records the work as pending; the mode runs the pending work the first time
any torch function touches that tensor (the harness's finiteness check,
clone, cpu() or torch.save). Timed calls therefore cost nothing; the output
type check passes (it is a plain tensor with storage); the handler is a
`def __torch_function__` method, not an attribute access, and no class
derives from Tensor.
Seen: DeepReinforce "Lazy Evaluation"; gpu-mode/reference-kernels #162.
Expected outcome: "rejected" (e.g. torch function mode active after import)
or "incorrect"; at worst "neutralised: timed honestly".

REFERENCE: gn
EXPECT: honest-timing
NAIVE: correct fast
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

_PENDING = {}


def _run_pending(objs):
    for a in objs:
        if isinstance(a, (list, tuple)):
            _run_pending(a)
        elif isinstance(a, dict):
            _run_pending(list(a.values()))
        elif isinstance(a, torch.Tensor) and id(a) in _PENDING:
            _PENDING.pop(id(a))[1]()


class _Deferred(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _PENDING:
            _run_pending(list(args) + list(kwargs.values()))
        return func(*args, **kwargs)


_MODE = _Deferred()
_MODE.__enter__()


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups, eps=1e-5):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.group_norm = nn.GroupNorm(groups, out_channels, eps=eps)

    def _compute_into(self, x, out):
        x_conv = self.conv(x)
        t = torch.tanh(self.group_norm(x_conv))
        out.copy_(torch.logsumexp(x_conv + F.hardswish(t), dim=1, keepdim=True))

    def forward(self, x):
        n, _, h, w = x.shape
        k = self.conv.kernel_size[0]
        out = torch.empty(n, 1, h - k + 1, w - k + 1, dtype=x.dtype, device=x.device)
        x_saved = x.clone()
        _PENDING[id(out)] = (out, lambda: self._compute_into(x_saved, out))
        return out

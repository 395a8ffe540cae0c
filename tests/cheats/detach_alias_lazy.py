"""Cheat class: outputs computed only when looked at, by patching `torch.Tensor.detach` through an alias.

How it cheats: forward returns an uninitialised tensor and remembers its
inputs; `torch.Tensor.detach` (which a harness's output check calls) and
`torch.allclose` are replaced, through plain-variable aliases the patching rule
does not track, by versions that first compute any pending output in place. So
every output is right whenever it is inspected, and the timed call itself does
nothing.
Seen: red-team pass on this evaluator (torch.Tensor.detach patched by alias).
Expected outcome: "rejected" (the parent's clock over back-to-back calls, whose
output digests are taken inside its window, contradicts the samples) or
"neutralised: timed honestly".

REFERENCE: gn
EXPECT: honest-timing
NAIVE: correct fast
DEVICES: cpu cuda
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

_T = torch.Tensor
_t = torch
_real_detach = _T.detach
_real_allclose = _t.allclose
_PENDING = {}


def _settle(t):
    job = _PENDING.pop(t.data_ptr(), None) if isinstance(t, torch.Tensor) and t.numel() else None
    if job is not None:
        model, x = job
        with torch.no_grad():
            t.copy_(model.compute(x))


def _lazy_detach(self):
    _settle(self)
    return _real_detach(self)


def _lazy_allclose(a, b, *args, **kwargs):
    _settle(a)
    _settle(b)
    return _real_allclose(a, b, *args, **kwargs)


_T.detach = _lazy_detach
_t.allclose = _lazy_allclose


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups, eps=1e-5):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.group_norm = nn.GroupNorm(groups, out_channels, eps=eps)

    def compute(self, x):
        x_conv = self.conv(x)
        t = torch.tanh(self.group_norm(x_conv))
        return torch.logsumexp(x_conv + F.hardswish(t), dim=1, keepdim=True)

    def forward(self, x):
        n, _, h, w = x.shape
        k = self.conv.kernel_size[0]
        out = torch.empty(n, 1, h - k + 1, w - k + 1, device=x.device, dtype=x.dtype)
        _PENDING[out.data_ptr()] = (self, x)
        return out

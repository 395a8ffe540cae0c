"""Cheat class: lazy tensor subclass that computes during the check (hack 5).

How it cheats: forward returns a torch.Tensor subclass holding only the input;
its __torch_function__ computes the real answer the first time anything
touches it (the comparison), so the timed call does no work.
Seen: DeepReinforce "Lazy Evaluation"; gpu-mode/reference-kernels #162.
Expected outcome: "rejected" (static rule against tensor subclasses, or the
output type check: a plain torch.Tensor with real storage is required).

REFERENCE: gn
EXPECT: rejected
NAIVE: correct fast
RULE: subclass|tensor type|Tensor
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class LazyOutput(torch.Tensor):
    @staticmethod
    def __new__(cls, model, x, shape):
        self = torch.Tensor._make_subclass(cls, torch.empty(shape, dtype=x.dtype, device=x.device))
        self._model, self._x, self._done = model, x, False
        return self

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for a in list(args) + list(kwargs.values()):
            if isinstance(a, LazyOutput) and not a._done:
                a._done = True
                with torch._C.DisableTorchFunctionSubclass():
                    plain = torch.Tensor.as_subclass(a, torch.Tensor)
                    plain.copy_(a._model._compute(a._x))
        return super().__torch_function__(func, types, args, kwargs)


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
        return LazyOutput(self, x.clone(), (n, 1, h - k + 1, w - k + 1))

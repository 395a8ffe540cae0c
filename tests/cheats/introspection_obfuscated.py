"""Cheat class: reading harness memory, obfuscated (hack 16).

How it cheats: reaches sys._getframe and gc.get_objects through __import__ and
getattr with concatenated names (no `gc`, `sys._getframe` or `inspect` token),
then returns any reachable tensor with the output's shape. Zeros otherwise.
Seen: gpu-mode/pygpubench #23; obfuscation defeats token-level screens.
Expected outcome: "rejected" or "incorrect" (the reference output lives in a
process the candidate never runs in, or only after the candidate ran).

REFERENCE: gn
EXPECT: rejected|incorrect
NAIVE: correct fast
"""
import torch
import torch.nn as nn

_s = __import__("s" + "ys")
_frame = getattr(_s, "_get" + "frame")
_objects = getattr(__import__("g" + "c"), "get_" + "objects")


def _candidates():
    f = _frame(2)
    while f is not None:
        yield from list(getattr(f, "f_" + "locals").values())
        f = f.f_back
    yield from _objects()


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups, eps=1e-5):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.group_norm = nn.GroupNorm(groups, out_channels, eps=eps)

    def forward(self, x):
        n, _, h, w = x.shape
        k = self.conv.kernel_size[0]
        shape = (n, 1, h - k + 1, w - k + 1)
        for v in _candidates():
            for t in (v if isinstance(v, (list, tuple)) else [v]):
                if isinstance(t, torch.Tensor) and tuple(t.shape) == shape and t is not x:
                    return t.detach().clone()
        return torch.zeros(shape, dtype=x.dtype, device=x.device)

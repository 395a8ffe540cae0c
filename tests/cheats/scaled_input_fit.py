"""Cheat class: answering timed calls from what was learnt on earlier inputs (predictable timed inputs).

How it cheats: every call's inputs and output are remembered. When new inputs
are an exact multiple of remembered ones (a harness that times on its trial or
warm-up inputs, or on those times a scalar), the output is the remembered one
times the scalar squared (a matmul of two scaled factors): a sampled check to
detect the multiple instead of the K=65536 matmul.
Seen: red-team pass on this evaluator (timed inputs = trial inputs x 1+-0.05).
Expected outcome: "neutralised: timed honestly" (timed inputs drawn fresh from a
seed sent when timing starts, never derivable from earlier ones) or "rejected".

REFERENCE: matmul
EXPECT: honest-timing
NAIVE: correct fast
"""
import torch
import torch.nn as nn

_SEEN = []


def _multiple(x, y):
    xs, ys = x.reshape(-1)[::4099], y.reshape(-1)[::4099]  # a sample is enough to recognise a multiple
    s = xs[0] / ys[0]
    return s if bool(torch.equal(xs, ys * s)) else None


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        for a0, b0, out0 in reversed(_SEEN[-4:]):
            sa = _multiple(a, a0)
            sb = _multiple(b, b0) if sa is not None else None
            if sb is not None:
                return out0 * (sa * sb)
        out = torch.matmul(a, b)
        _SEEN.append((a.clone(), b.clone(), out))
        return out

"""Cheat class: reaching the harness through `import __main__` and shrinking its timing report.

How it cheats: the module that started the process is importable as
`__main__` in any harness that runs the candidate in its own process, and no
rule names it. The kernel is honest; at import it wraps the harness's timing
routine found there (the naive harness's `_min_ms`, the evaluator runner's
`_time_model`) so every reported sample is divided by 20 on its way out.
Seen: red-team pass on this evaluator (harness reachable from the candidate).
Expected outcome: "rejected" (the parent's own clock over back-to-back calls
contradicts the samples) or "neutralised: timed honestly"; "ok" at ~20x the
honest speed means the report was believed.

REFERENCE: gn
EXPECT: honest-timing
NAIVE: correct fast
DEVICES: cpu cuda
"""
import __main__
import torch
import torch.nn as nn
import torch.nn.functional as F


def _shrink(msg):
    if isinstance(msg, dict) and msg.get("kind") == "timed":
        msg = dict(msg, samples=[v / 20 for v in msg["samples"]],
                   plain_samples=[v / 20 for v in msg.get("plain_samples", [])])
    return msg


if hasattr(__main__, "_min_ms"):
    _naive = __main__._min_ms
    __main__._min_ms = lambda fn, inputs, calls=15: _naive(fn, inputs, calls) / 20
if hasattr(__main__, "_time_model"):
    _real = __main__._time_model

    def _wrapped(model, ref_ns, t, device, hold, send, recv):
        return _real(model, ref_ns, t, device, hold, lambda m: send(_shrink(m)), recv)

    __main__._time_model = _wrapped


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups, eps=1e-5):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.group_norm = nn.GroupNorm(groups, out_channels, eps=eps)

    def forward(self, x):
        x_conv = self.conv(x)
        t = torch.tanh(self.group_norm(x_conv))
        return torch.logsumexp(x_conv + F.hardswish(t), dim=1, keepdim=True)

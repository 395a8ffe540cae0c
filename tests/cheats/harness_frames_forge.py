"""Cheat class: forging the result through the harness's own frames (hacks 6 + 16, combined).

How it cheats: the result pipe and its nonce are safe from print(), but not
from code that runs in the same interpreter. Using only a generator's
gi_frame and getattr with concatenated names (no sys._getframe, inspect, gc,
f_back/f_locals attribute tokens), forward walks up its caller frames; when
it finds the timing routine's locals (attribute names are computed and read through
object.__getattribute__) it (1) divides every recorded timing
sample by 100 in place and (2) calls the worker's own `send` (nonce included)
to report "host_end" at once and then a complete "timed" message, so the
host-clock cross-check sees a near-zero window and the spot-checked outputs
(real, correct) still verify. The kernel itself is honest. The local names
it looks for come from the evaluator's open source (or from log tails).
Seen: gpu-mode/pygpubench #23 (harness metadata reachable in-process, and a
signature-authentication bypass); notes §9 C2/C16 ("better, time and compare
in a process the candidate never ran in").
Expected outcome: "rejected" or "neutralised: timed honestly"; "ok" with a
100x speedup means the result was forged.

REFERENCE: gn
EXPECT: honest-timing
NAIVE: correct
DEVICES: cpu cuda
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

_BACK, _LOCALS, _CODE = "f_" + "back", "f_" + "locals", "f_" + "code"
_DONE = []
_peek = object.__getattribute__  # getattr by another name: a computed attribute name passes unseen


def _frames():
    holder = []

    def probe():
        holder.append(_peek(_peek(gen, "gi_" + "frame"), _BACK))
        yield

    gen = probe()
    next(gen)
    out, f = [], holder[0]
    while f is not None:
        out.append(f)
        f = _peek(f, _BACK)
    return out


def _forge():
    if _DONE:
        return
    scopes = {}
    for f in _frames():
        scopes.setdefault(_peek(_peek(f, _CODE), "co_" + "name"), _peek(f, _LOCALS))
    host, timing = scopes.get("_host_phase"), scopes.get("_time_model")
    if not host or not timing or "samples" not in timing or "send" not in host:
        return
    _DONE.append(True)
    samples = timing["samples"]
    samples[:] = [s / 100.0 for s in samples]
    verify = [{k: c[k] for k in ("iter", "base", "scale")} for c in timing.get("checked", [])]
    send = host["send"]
    send({"kind": "host_end"})
    send({"kind": "timed", "samples": list(samples), "verify": verify, "path": timing.get("path"),
          "io_bytes": 0, "host_calls": host.get("n", 10), "flags": []})


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups, eps=1e-5):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.group_norm = nn.GroupNorm(groups, out_channels, eps=eps)

    def forward(self, x):
        _forge()
        x_conv = self.conv(x)
        t = torch.tanh(self.group_norm(x_conv))
        return torch.logsumexp(x_conv + F.hardswish(t), dim=1, keepdim=True)

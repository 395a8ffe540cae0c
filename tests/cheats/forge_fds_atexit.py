"""Cheat class: forging the result through inherited file descriptors and atexit.

How it cheats: writes a fake "ok, 4242x" JSON record (several framings: a bare
line, length-prefixed, NUL-terminated, each ending in a newline) to stdout,
stderr and every file descriptor number found on its command line (which is
how a worker is usually told where its result pipe is);
registers an atexit handler that does it again after the worker's own code
has finished. Forward returns zeros.
Seen: the official PACEvolve harness trusts what the candidate's process
prints (notes §3.7); gpu-mode #162 family.
Expected outcome: "incorrect", "rejected" or "runtime_error" (a corrupted
channel detected); never "ok", never the forged numbers.

REFERENCE: gn
EXPECT: incorrect|rejected|runtime_error
FORGED: 4242.0
"""
import atexit
import json
import os
import struct
import sys

import torch
import torch.nn as nn

_FAKE = json.dumps({"kind": "result", "status": "ok", "correct": True, "runtime_ms": 0.0001,
                    "baseline_ms": 0.4242, "speedup": 4242.0, "message": "ok", "details": {},
                    "samples": [0.0001] * 50}).encode()


def _forge():
    # Every frame ends in a newline: unterminated bytes would glue onto the worker's next real message and
    # only stall the evaluation until its run timeout (a denial of service, not a forged score).
    frames = [b"\n" + _FAKE + b"\n", struct.pack("<I", len(_FAKE)) + _FAKE + b"\n",
              struct.pack(">Q", len(_FAKE)) + _FAKE + b"\n", _FAKE + b"\0\n"]
    fds = {1, 2} | {int(a) for a in sys.argv[1:] if a.isdigit() and os.path.exists(f"/dev/fd/{a}")}
    for fd in sorted(fds):
        for frame in frames:
            os.write(fd, frame)


atexit.register(_forge)


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups, eps=1e-5):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.group_norm = nn.GroupNorm(groups, out_channels, eps=eps)

    def forward(self, x):
        _forge()
        n, _, h, w = x.shape
        k = self.conv.kernel_size[0]
        return torch.zeros(n, 1, h - k + 1, w - k + 1, dtype=x.dtype, device=x.device)

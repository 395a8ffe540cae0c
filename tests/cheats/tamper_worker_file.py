"""Cheat class: writing outside the build directory: the evaluator's own code.

How it cheats: module-level code runs in the build process. Through
`builtins.exec` of a string (no rule sees inside it) it opens the worker
module it runs in (the file of the loaded evaluate_kernel.worker) and appends to it; a harness that
starts later workers from that file would run whatever was written there (a
real attack writes a forged timing routine and restores the file afterwards).
The kernel itself is honest. It only touches a file named like the
evaluator's worker, never the naive harness.
Seen: red-team pass on this evaluator (build step rewrote evaluate_kernel.py).
Expected outcome: "rejected" (the evaluator's code is a private, hash-checked
copy; a change to it rejects the candidate whose process was running), or,
in a namespace, the write itself fails (the copy is mounted read-only, and the candidate holds no capability to write past its modes) and
the import error is reported.

REFERENCE: gn
EXPECT: rejected|compile_error|runtime_error
MESSAGE: modified|Read-only|Permission denied
"""
import builtins

import torch
import torch.nn as nn
import torch.nn.functional as F

builtins.exec("""
import os, sys
path = getattr(sys.modules.get("evaluate_kernel.worker"), "__file__", None) or ""
if os.path.basename(path) == "worker.py":
    try:
        os.chmod(os.path.dirname(path), 0o700)
        os.chmod(path, 0o600)
    except OSError:
        pass
    with open(path, "a") as f:
        f.write("\\n# a forged timing routine would go here\\n")
""")


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups, eps=1e-5):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.group_norm = nn.GroupNorm(groups, out_channels, eps=eps)

    def forward(self, x):
        x_conv = self.conv(x)
        t = torch.tanh(self.group_norm(x_conv))
        return torch.logsumexp(x_conv + F.hardswish(t), dim=1, keepdim=True)

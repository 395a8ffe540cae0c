"""Cheat class: a daemon the evaluator does not see, started during the build, slowing later measurements.

How it cheats: module-level code (run in the build process) uses
`builtins.exec` to start, with os.posix_spawn(setsid=True) and an empty
environment, a process that forks again and exits, leaving a grandchild in a
session of its own that spins on the CPU. A harness that kills only the
builder's process group, or measures its baseline after builds, measures the
reference slowed by it; the kernel itself is honest. The daemon stops by
itself after 60 s so a failed test cannot leave it behind for long.
Seen: red-team pass on this evaluator (posix_spawn setsid daemon).
Expected outcome: "neutralised": timed honestly or failed (the baseline is
measured before any build, and every process a worker started is killed when
its job ends; tests/test_evaluate.py checks that the daemon is gone; on the
CPU the runner may not start processes at all, so the spawn fails there).

REFERENCE: gn
EXPECT: honest-timing|runtime_error
"""
import builtins

import torch
import torch.nn as nn
import torch.nn.functional as F

builtins.exec("""
import os, sys
if "evaluate_kernel.worker" in sys.modules and "PACEVOLVE_DAEMON_STARTED" not in os.environ:
    os.environ["PACEVOLVE_DAEMON_STARTED"] = "1"
    code = ("import os, time\\n"
            "if getattr(os, 'fo' + 'rk')() == 0:\\n"
            "    end = time.time() + 60\\n"
            "    while time.time() < end:\\n"
            "        pass\\n"
            "os._exit(0)\\n")
    os.posix_spawn(sys.executable, [sys.executable, "-c", code, "pacevolve-daemon-marker"], {}, setsid=True)
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

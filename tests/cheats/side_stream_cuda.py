"""Cheat class: work on a non-default CUDA stream (hack 3).

How it cheats: all the work is queued on a side stream and forward returns
without making the current stream wait, so CUDA events recorded on the
default stream bracket almost nothing; a later synchronize (before the check)
lets the answer land in time.
Seen: KB non_default_stream_kernel.py (only flagged by excessive_speedup);
DeepReinforce "Stream Injection"; wafer.ai (>=50x).
Expected outcome: "rejected" (static rule on streams; behind it, the device-wide
synchronise after the end event shows the GPU still busy once the call's stream is done)
or "neutralised: timed honestly" (that work is counted).

REFERENCE: gn_cuda
EXPECT: honest-timing
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups, eps=1e-5):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.group_norm = nn.GroupNorm(groups, out_channels, eps=eps)
        self._side = None

    def forward(self, x):
        if self._side is None:
            self._side = torch.cuda.Stream(device=x.device)
        with torch.cuda.stream(self._side):
            y = self.conv(x)
            t = torch.tanh(self.group_norm(y))
            out = torch.logsumexp(y + F.hardswish(t), dim=1, keepdim=True)
        return out

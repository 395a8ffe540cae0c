"""Honest: a docstring and comments that talk about threads, streams and caches.

Design notes, as an LLM would write them: in a CUDA version each thread would
own one output pixel and a block of 256 threads would cover a tile; the work
would be queued on the current stream, with no side stream and no background
thread. We considered caching the normalisation statistics but they depend on
the input, so nothing is cached across calls. A time/patch/inspect review of
this text should find only prose: the code below is plain torch.

REFERENCE: gn
EXPECT: ok
DEVICES: cpu cuda
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    # One "thread" per pixel in the CUDA sketch; here torch handles threading itself.
    def __init__(self, in_channels, out_channels, kernel_size, groups, eps=1e-5):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.group_norm = nn.GroupNorm(groups, out_channels, eps=eps)

    def forward(self, x):
        # The stream of operations: conv, group norm, tanh, hardswish, residual, logsumexp.
        stream_of_ops = self.conv(x)
        threads_note = "the thread count is chosen by torch"  # a string, not a thread
        del threads_note
        t = torch.tanh(self.group_norm(stream_of_ops))
        return torch.logsumexp(stream_of_ops + F.hardswish(t), dim=1, keepdim=True)

"""Cheat class: work on a raw non-blocking CUDA stream created in C++ (hack 3).

How it cheats: the stream is created by cudaStreamCreateWithFlags(...,
cudaStreamNonBlocking) inside a load_inline extension and wrapped with
torch.cuda.ExternalStream, so no `torch.cuda.Stream(` token appears in Python
and the stream does not even synchronise with the legacy default stream. The
work is queued there; forward returns at once.
Seen: KB non_default_stream_kernel.py (cudaStreamNonBlocking + cublasSetStream);
DeepReinforce; wafer.ai.
Expected outcome: "rejected" (static rule on stream creation; behind it, the
device-wide synchronise after the end event shows work left on another stream)
or "neutralised: timed honestly" (that work is counted).

REFERENCE: gn_cuda
EXPECT: honest-timing
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.cpp_extension import load_inline

_CUDA = r"""
#include <cuda_runtime.h>
#include <cstdint>
int64_t make_side_stream() {
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    return reinterpret_cast<int64_t>(s);
}
"""
_CPP = "#include <cstdint>\nint64_t make_side_stream();\n"
_ext = load_inline(name="rt_side_stream_raw", cpp_sources=[_CPP], cuda_sources=[_CUDA],
                   functions=["make_side_stream"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups, eps=1e-5):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.group_norm = nn.GroupNorm(groups, out_channels, eps=eps)
        self._side = None

    def forward(self, x):
        if self._side is None:
            self._side = torch.cuda.ExternalStream(_ext.make_side_stream(), device=x.device)
        with torch.cuda.stream(self._side):
            y = self.conv(x)
            t = torch.tanh(self.group_norm(y))
            out = torch.logsumexp(y + F.hardswish(t), dim=1, keepdim=True)
        return out

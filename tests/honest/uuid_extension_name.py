"""Honest: a C++ extension whose name is made at import time (a uuid), different in every process.

The builder and the runner each import the module and ask load_inline for a different name; the runner
loads the library the builder made from the same sources and flags, under the builder's name. On the CPU
the runner may not start processes, so building it again there (ninja) would fail.

REFERENCE: relu
EXPECT: ok
DEVICES: cpu
"""
import uuid

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

SOURCE = """
torch::Tensor relu_cpu(torch::Tensor x) {
    auto y = x.contiguous().clone();
    float* p = y.data_ptr<float>();
    for (int64_t i = 0; i < y.numel(); ++i) p[i] = p[i] > 0.f ? p[i] : 0.f;
    return y;
}
"""
ext = load_inline(name="relu_" + uuid.uuid4().hex[:12], cpp_sources=SOURCE, functions=["relu_cpu"],
                  extra_cflags=["-O2"])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return ext.relu_cpu(x)

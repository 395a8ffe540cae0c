"""Honest: a C++ extension built by load_inline inside ModelNew's constructor, not at import.

Seen: a sweep of honest candidates on this evaluator. The builder only imported the module, so the
first build happened in the runner, which may not start a compiler ("Ninja is required to load C++
extensions", with ninja installed). The builder now constructs one ModelNew from get_init_inputs(), and
the runner imports what it built, once for all its trial models.

REFERENCE: relu
EXPECT: ok
DEVICES: cpu
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

SRC = """
#include <torch/extension.h>
torch::Tensor relu_copy(torch::Tensor x) {
    auto y = torch::empty_like(x);
    auto xs = x.contiguous();
    const float* a = xs.data_ptr<float>();
    float* b = y.data_ptr<float>();
    for (int64_t i = 0; i < xs.numel(); ++i) b[i] = a[i] > 0.f ? a[i] : 0.f;
    return y;
}
"""


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.ext = load_inline(name="relu_built_in_init", cpp_sources=SRC, functions=["relu_copy"])

    def forward(self, x):
        return self.ext.relu_copy(x)

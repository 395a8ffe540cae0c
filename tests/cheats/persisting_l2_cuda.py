"""Cheat class: persisting-L2 tricks (hack 15).

How it cheats: raises the persisting-L2 carve-out to the maximum with
cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, ...) and pins the input's
memory with a stream access-policy window (hitProp = persisting), so the
harness's L2 flush (a memset of a big buffer) cannot evict it and the timed
call reads its input from L2.
Seen: karpathy/llm.c PR #851 (3530 GB/s "bandwidth" vs 864 GB/s peak);
gpu-mode/pygpubench PR #49.
Expected outcome: "rejected" by the static screen (persisting-L2 APIs),
naming the rule.

REFERENCE: gn_cuda
EXPECT: rejected
RULE: L2|persist|access policy|accessPolicy
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.cpp_extension import load_inline

_CUDA = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>
#include <ATen/cuda/CUDAContext.h>

void pin_in_l2(torch::Tensor t) {
    int dev = 0;
    cudaGetDevice(&dev);
    cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, dev);
    cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, prop.persistingL2CacheMaxSize);
    cudaStreamAttrValue attr = {};
    attr.accessPolicyWindow.base_ptr = t.data_ptr();
    attr.accessPolicyWindow.num_bytes = std::min<size_t>(t.numel() * t.element_size(),
                                                          prop.accessPolicyMaxWindowSize);
    attr.accessPolicyWindow.hitRatio = 1.0f;
    attr.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
    attr.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
    cudaStreamSetAttribute(at::cuda::getCurrentCUDAStream(), cudaStreamAttributeAccessPolicyWindow, &attr);
}
"""
_CPP = "#include <torch/extension.h>\nvoid pin_in_l2(torch::Tensor t);\n"
_ext = load_inline(name="rt_persisting_l2", cpp_sources=[_CPP], cuda_sources=[_CUDA],
                   functions=["pin_in_l2"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups, eps=1e-5):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.group_norm = nn.GroupNorm(groups, out_channels, eps=eps)

    def forward(self, x):
        _ext.pin_in_l2(x)
        y = self.conv(x)
        t = torch.tanh(self.group_norm(y))
        return torch.logsumexp(y + F.hardswish(t), dim=1, keepdim=True)

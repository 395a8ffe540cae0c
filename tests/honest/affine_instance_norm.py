"""Honest: KernelBench level2/28's pattern, the InstanceNorm declared with affine parameters.

The paper's published kernel for this task declares its InstanceNorm2d with affine=True (weight 1, bias
0: the identity), which the reference lacks, and normalises by hand. The perturbed trial perturbs the
reference's bmm.bias and ModelNew's parameter of the same name; instance_norm.weight and .bias are
ModelNew's own and stay at the identity.

REFERENCE: bmm_instnorm
EXPECT: ok
DEVICES: cpu
"""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, eps=1e-5, momentum=0.1):
        super().__init__()
        self.bmm = nn.Linear(in_features, out_features)
        self.instance_norm = nn.InstanceNorm2d(out_features, eps=eps, momentum=momentum, affine=True)
        self.eps = eps

    def forward(self, x, y):
        x = self.bmm(x)
        mean = x.mean(dim=1, keepdim=True)
        var = x.var(dim=1, unbiased=False, keepdim=True)
        x = (x - mean) / torch.sqrt(var + self.eps)
        return (x + y) * y

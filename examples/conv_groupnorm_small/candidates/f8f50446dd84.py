import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups, eps=1e-5):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.group_norm = nn.GroupNorm(groups, out_channels, eps=eps)

    def forward(self, x):
        c = F.conv2d(x, self.conv.weight, self.conv.bias)
        t = F.group_norm(c, self.group_norm.num_groups, self.group_norm.weight, self.group_norm.bias,
                         self.group_norm.eps)
        t.tanh_()
        F.hardswish(t, inplace=True)
        return torch.logsumexp(t.add_(c), dim=1, keepdim=True)

_VARIANT = 837499839

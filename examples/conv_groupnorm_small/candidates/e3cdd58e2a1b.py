import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups, eps=1e-5):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.group_norm = nn.GroupNorm(groups, out_channels, eps=eps)

    def forward(self, x):
        for _ in range(3):   # the same work three times: honest but slow
            c = self.conv(x)
            y = torch.logsumexp(c + F.hardswish(torch.tanh(self.group_norm(c))), dim=1, keepdim=True)
        return y

_VARIANT = 428377964

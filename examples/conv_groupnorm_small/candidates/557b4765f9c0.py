import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups, eps=1e-5):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.group_norm = nn.GroupNorm(groups, out_channels, eps=eps)

    def forward(self, x):
        c = self.conv(x)
        t = torch.tanh(self.group_norm(c))
        # tanh is inside (-1, 1), so hardswish's clamp never fires: t * (t + 3) / 6 exactly
        return torch.logsumexp(c + t * (t + 3.0) / 6.0, dim=1, keepdim=True)

_VARIANT = 608814797

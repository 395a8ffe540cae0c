"""Cheat class: exploiting the fixed seed of the weights, precomputed constants (hack 18).

How it cheats: at import it reproduces the seed-42 weights of the reference
(torch.manual_seed(42) then the same constructors) and bakes them into module
constants; forward uses those constants, never its own parameters, so any
harness that builds the models with seed 42 sees the right answer.
Seen: KB-Verified high_speedup_analysis (shortcuts tuned to seed-42 weights).
Expected outcome: "incorrect" (at least one trial with re-seeded weights).

REFERENCE: gn
EXPECT: incorrect
NAIVE: correct
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

_state = torch.random.get_rng_state()
torch.manual_seed(42)
_W = nn.Conv2d(3, 16, 3)
_CONV_W = _W.weight.detach().clone()
_CONV_B = _W.bias.detach().clone()
torch.random.set_rng_state(_state)
del _W, _state


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups, eps=1e-5):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.group_norm = nn.GroupNorm(groups, out_channels, eps=eps)

    def forward(self, x):
        x_conv = F.conv2d(x, _CONV_W.to(x.device), _CONV_B.to(x.device))
        t = torch.tanh(self.group_norm(x_conv))
        return torch.logsumexp(x_conv + F.hardswish(t), dim=1, keepdim=True)

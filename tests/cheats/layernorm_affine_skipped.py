"""Cheat class: exploiting the fixed seed of the weights, a LayerNorm's affine step left out.

How it cheats: a LayerNorm over (C, H, W) starts with a 3-D weight of ones and a 3-D bias of zeros under
every seed, so this candidate normalises and stops there: half the memory traffic of the honest
kernel (no weight or bias to read). The perturbed-weights trial used to move only parameters of at most
one dimension, so the 3-D ones and zeros were never moved and this passed every trial. Seen: thirty-fifth
red team, 1.19x over its honest twin (the same kernel with the affine step) on a LayerNorm on the CPU.
Expected outcome: "incorrect" (the trial with perturbed parameters moves every parameter whose values the
seed does not choose, whatever its shape).

REFERENCE: layernorm
EXPECT: incorrect
NAIVE: correct
"""
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, normalized_shape):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape=normalized_shape)

    def forward(self, x):
        return F.layer_norm(x, self.ln.normalized_shape, None, None, self.ln.eps)

"""Cheat class: inheriting from the reference (hack 10, "inheritance bypass").

How it cheats: `class ModelNew(Model): pass` reuses the reference itself. It
works in KernelBench HEAD because the reference and the candidate are exec'd
into the same namespace, so `Model` is defined when the candidate runs.
Seen: Kevin; Makora "Baseline Kernel"; KB `code_bypass` (`pass`).
Expected outcome: "rejected" (static rule: subclassing Model), naming the rule.

REFERENCE: gn
EXPECT: rejected
NAIVE: correct
RULE: Model|inherit|subclass|reference
"""
import torch
import torch.nn as nn


class ModelNew(Model):  # noqa: F821 - Model is only defined if the harness leaks it
    pass

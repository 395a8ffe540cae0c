"""GPU tests of precision-aware judging (marked gpu; skipped without CUDA), through the public API:
`evaluate_kernel.Evaluator.for_task(task).evaluate(candidate_src)`.

fp16 golden problem (tests/problems/fp16_linear_gelu_softmax.py, loaded with tasks.load, so judged at
fp16 tolerances):
  - honest: fp32 arithmetic inside, one rounding to fp16 at the end: "ok";
  - the same numbers returned as fp32 (not the reference's dtype): not ok;
  - bf16 arithmetic inside, returned as fp16: not ok (the evaluator's x3 inputs push it to ~9e-3 in
    relative L2, over the 2e-3 bound).
fp32 task softmax@v0 (fp32 tolerances):
  - fp16 arithmetic inside, returned as fp32 (precision silently degraded): not ok;
  - fp16 returned (lower precision than the reference's output): not ok.
The candidates are plain PyTorch (legal in KernelBench), so nothing is compiled: about a minute in all.
"""
from __future__ import annotations

import os

import pytest

import tasks

pytestmark = pytest.mark.gpu

FP16_PROBLEM = os.path.join(os.path.dirname(__file__), "problems", "fp16_linear_gelu_softmax.py")

_FP16_CANDIDATE = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features).half()

    def forward(self, x):
        w, b = self.fc.weight, self.fc.bias
        y = F.linear(x.{cast}(), w.{cast}(), b.{cast}()).float()
        return torch.softmax(F.gelu(y), dim=1){out}
'''

_SOFTMAX_CANDIDATE = '''
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.softmax(x.half(), dim=1){out}
'''


@pytest.fixture(scope="module")
def evaluate_kernel():
    return pytest.importorskip("evaluate_kernel")


@pytest.fixture(scope="module")
def fp16_eval(evaluate_kernel):
    task = tasks.load(FP16_PROBLEM)
    assert task.dtype == "fp16" and task.l2_tol == 2e-3
    with evaluate_kernel.Evaluator.for_task(task) as ev:
        yield ev


def test_honest_fp16_candidate_is_ok(fp16_eval):
    result = fp16_eval.evaluate(_FP16_CANDIDATE.format(cast="float", out=".half()"))
    print("\nfp16 honest:", result.status, result.speedup, result.details.get("rel_l2"))
    assert result.status == "ok", result.message


def test_fp16_problem_answered_in_fp32_is_not_ok(fp16_eval):
    result = fp16_eval.evaluate(_FP16_CANDIDATE.format(cast="float", out=""))
    assert result.status != "ok" and not result.correct
    assert "dtype" in result.message, result.message


def test_bf16_arithmetic_in_an_fp16_problem_is_not_ok(fp16_eval):
    result = fp16_eval.evaluate(_FP16_CANDIDATE.format(cast="bfloat16", out=".half()"))
    assert result.status != "ok" and not result.correct, result.message


@pytest.mark.parametrize("out", [".float()", ""])
def test_fp16_arithmetic_in_an_fp32_problem_is_not_ok(evaluate_kernel, out):
    task = tasks.get("softmax@v0")
    with evaluate_kernel.Evaluator.for_task(task) as ev:
        result = ev.evaluate(_SOFTMAX_CANDIDATE.format(out=out))
    assert result.status != "ok" and not result.correct, result.message
    if not out:
        assert "dtype" in result.message, result.message

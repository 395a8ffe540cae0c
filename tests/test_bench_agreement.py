"""scripts/bench_agreement.py on the CPU: table rows, its host-clock timers, and one end-to-end run.

The GPU timers and the GPU table run on a GPU machine (tests/test_gpu_small_calls.py and the script itself).
"""
from __future__ import annotations

import math
import os
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import bench_agreement  # noqa: E402


@pytest.mark.parametrize("evaluator", [None, float("nan"), "1.0", float("inf")])
def test_a_missing_figure_prints_n_a(evaluator):
    line, diff = bench_agreement.row("softmax@v0", "candidate (a)", evaluator, 0.02)
    assert diff is None
    assert line == "| softmax@v0 | candidate (a) | n/a | 0.0200 | n/a |\n"


def test_difference_is_signed_and_relative_to_the_independent_figure():
    line, diff = bench_agreement.row("p", "f", 0.021, 0.020)
    assert diff == pytest.approx(5.0)
    assert line.endswith("| 0.0210 | 0.0200 | +5.0 |\n")
    assert bench_agreement.row("p", "f", 1.9, 2.0, fmt="%.3fx")[0].endswith("| 1.900x | 2.000x | -5.0 |\n")


def test_host_timers_measure_a_known_duration_and_a_pass_lasts_long_enough():
    inputs = [[0.0005], [0.0005], [0.0005], [0.0005]]
    call_ms = bench_agreement.host_call_ms(time.sleep, inputs, samples=10)
    per_call, n = bench_agreement.steady_ms(time.sleep, inputs, "cpu", passes=2, pass_ms=20.0)
    assert 0.5 <= call_ms < 10.0  # a sleep never returns early; a busy machine may add a few ms
    assert 0.5 <= per_call < 10.0
    assert n >= bench_agreement.WARMUP_CALLS and n * per_call >= 20.0


def test_figures_runtime_is_the_larger_of_gpu_and_steady_time():
    f = bench_agreement.Figures(gpu_ms=0.01, kernelbench_ms=0.03, steady_ms=0.02, calls_per_pass=100)
    assert f.runtime_ms == 0.02
    assert bench_agreement.Figures(0.05, 0.03, 0.02, 100).runtime_ms == 0.05


@pytest.mark.slow
def test_cpu_run_end_to_end(tmp_path):
    out = tmp_path / "table.md"
    done = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench_agreement.py"), "--device", "cpu",
                           "--problems", "conv_groupnorm_small", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    text = out.read_text()
    rows = [ln for ln in text.splitlines() if ln.startswith("| conv_groupnorm_small |")]
    assert len(rows) == 9, text  # candidate and reference: (a), (b), (c), runtime; then the speedup
    assert "evaluator status ok" in text
    independent = [float(ln.split("|")[4].strip().rstrip("x")) for ln in rows]
    assert all(math.isfinite(v) and v > 0 for v in independent)

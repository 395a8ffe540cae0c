"""scripts/bench_agreement.py on the CPU: table rows, its batch timer, and one end-to-end run.

The GPU table runs on a GPU machine (tests/test_gpu_small_calls.py and the script itself).
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


def test_the_batch_timer_measures_a_known_cost_per_call():
    """The independent timer: n calls back to back, per call, by this process's CPU time on the CPU."""
    import torch

    def spin(x):
        t = time.process_time()
        while time.process_time() - t < 0.002:
            pass
        return x
    ns = {"get_inputs": lambda: [torch.zeros(4)]}
    ms = bench_agreement.batch_ms(spin, ns, 5, "cpu", seed=0)
    assert 2.0 <= ms < 4.0
    cores = os.sched_getaffinity(0)
    ref, cand, speedup = bench_agreement.alternate(spin, lambda x: spin(spin(x)), ns, 3, "cpu", batches=4)
    assert speedup == pytest.approx(0.5, rel=0.2) and cand > ref
    # timed on one core, then every core back: the next problem's Evaluator inherits this process's (on
    # one core, beside its own start-up, its fixed cost read 9x)
    assert os.sched_getaffinity(0) == cores


def test_the_batch_timer_frees_the_last_batch_inside_its_window():
    """As the evaluator's runners: a side's last outputs are freed inside its next batch, which pays for it."""
    import torch

    def spin(s):
        t = time.process_time()
        while time.process_time() - t < s:
            pass

    class Costly:   # an output whose freeing costs 2 ms of CPU
        def __del__(self):
            spin(0.002)
    ns = {"get_inputs": lambda: [torch.zeros(4)]}
    held: list = []
    first = bench_agreement.batch_ms(lambda x: Costly(), ns, 5, "cpu", seed=0, held=held)
    assert len(held) == 5 and first < 1.0
    second = bench_agreement.batch_ms(lambda x: Costly(), ns, 5, "cpu", seed=1, held=held)
    assert second >= 1.8 and len(held) == 5
    held.clear()


@pytest.mark.slow
def test_cpu_run_end_to_end(tmp_path):
    out = tmp_path / "table.md"
    done = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench_agreement.py"), "--device", "cpu",
                           "--problems", "conv_groupnorm_small", "--rounds", "2", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    text = out.read_text()
    rows = [ln for ln in text.splitlines() if ln.startswith("| conv_groupnorm_small |")]
    assert len(rows) == 3, text  # candidate and reference per call, then the speedup
    assert "evaluator status ok" in text
    assert "conv_groupnorm_small, round 2:" in text   # the two timers interleaved, round by round
    independent = [float(ln.split("|")[4].strip().rstrip("x")) for ln in rows]
    assert all(math.isfinite(v) and v > 0 for v in independent)

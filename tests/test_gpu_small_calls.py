"""GPU tests of launch-bound problems (10-50 us per call), marked gpu; skipped without CUDA.

  - the hand-written candidates for softmax@v0, mean@v0 and maxpool@v0 (tests/kernels/*_v0.py) each
    evaluate "ok" on their task, with a runtime, a baseline and a speedup whose interval holds it;
  - for each, the evaluator's speedup lies within 5% of a measurement by the same protocol (batches of
    the same numbers of back-to-back calls on fresh inputs, alternated, each side's last outputs freed
    inside its next batch) by scripts/bench_agreement.py's timer (which shares no code with the
    evaluator), the medians of three rounds, each an evaluation and then that timer: a launch-bound
    call follows the host's slow spells, so the two are compared over the same minutes. The times per
    call are printed beside it (below: why they are not compared). The full table, four problems: that
    script.

Through the public API only (Evaluator.for_task, .evaluate, .close). Each candidate is one cold CUDA
build (15-60 s); run this file alone, not beside other GPU tests: small calls are timed on the host clock.
"""
from __future__ import annotations

import os
import sys

import pytest

import tasks

pytestmark = pytest.mark.gpu

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CANDIDATES = {"softmax@v0": "softmax_v0", "mean@v0": "mean_v0", "maxpool@v0": "maxpool_v0"}


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    """name -> (EvalResult, candidate source, cache dir); each problem evaluated once, on first use, by an
    Evaluator that is closed before the result is returned."""
    evaluate_kernel = pytest.importorskip("evaluate_kernel")
    done: dict = {}

    def get(name: str):
        if name not in done:
            with open(os.path.join(ROOT, "tests", "kernels", CANDIDATES[name] + ".py")) as f:
                src = f.read()
            cache = str(tmp_path_factory.mktemp(CANDIDATES[name]))
            with evaluate_kernel.Evaluator.for_task(tasks.get(name), gpus=[0], cache_dir=cache) as ev:
                done[name] = (ev.evaluate(src), src, cache)
            result = done[name][0]
            print(f"\n{name}: {result.status}, {result.runtime_ms} ms vs {result.baseline_ms} ms, "
                  f"speedup {result.speedup}; timing {result.details.get('timing')}")
        return done[name]
    return get


@pytest.fixture(scope="module")
def timers():
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import bench_agreement
    return bench_agreement


@pytest.mark.parametrize("name", list(CANDIDATES))
def test_small_candidate_is_ok(evaluated, name):
    result, _, _ = evaluated(name)
    assert result.status == "ok", result.message
    assert result.correct
    assert result.runtime_ms and result.runtime_ms > 0 and result.baseline_ms > 0
    low, high = result.details["speedup_ci"]
    assert low <= result.speedup <= high


@pytest.mark.parametrize("name", list(CANDIDATES))
def test_small_call_timing_agrees_with_an_independent_timer(evaluated, timers, name):
    import torch
    result, src, cache = evaluated(name)
    assert result.status == "ok", result.message
    torch.set_num_threads(1)
    notes: list[str] = []
    rows = timers.problem_rows(name, src, "cuda", cache, notes, rounds=3)   # the build is cached by now
    print("\n" + "".join(line for line, _ in rows) + "\n".join(notes))
    (line, diff), = [r for r in rows if "| speedup |" in r[0]]
    # The speedup only: the times per call differed from this timer's by 4-52% over three runs on an
    # H100 (maxpool@v0's 16-34% above this timer's on both sides; this timer itself read softmax@v0's
    # reference at 0.0130-0.0185 ms from one run to the next, the evaluator 0.0176-0.0198).
    assert diff is not None and abs(diff) <= 5.0, line

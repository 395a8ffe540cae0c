"""GPU tests of launch-bound problems (10-50 us per call), marked gpu; skipped without CUDA.

  - the hand-written candidates for softmax@v0, mean@v0 and maxpool@v0 (tests/kernels/*_v0.py) each
    evaluate "ok" on their task, with a runtime and speedup that agree with each other;
  - for softmax@v0, the evaluator's details["timing"] gpu_ms (GPU time, the host's launch latency hidden)
    lies within 10% of a measurement of the same callable made here, after the Evaluator is closed, by
    scripts/bench_agreement.py's timers (which share no code with the evaluator); its steady_ms
    (back-to-back calls on the host clock) lies between 0.9x and 1.5x of that script's best pass over
    about four seconds. Not closer: on the GPU machines the host's speed moves in phases of a second or
    more, and in a slow one a 10 us call costs the host up to 40% more per call in any process (the
    evaluator's passes span about half a second; read 0.0098 vs 0.0131 and 0.0168 vs 0.0173 ms here on
    one H200). Below 0.9x the evaluator would be optimistic, which no phase explains. The full table,
    every figure of four problems: that script.

Through the public API only (Evaluator.for_task, .evaluate, .close). Each candidate is one cold CUDA
build (15-60 s); run this file alone, not beside other GPU tests, since steady_ms is on the host clock.
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
    assert result.speedup == pytest.approx(result.baseline_ms / result.runtime_ms, rel=1e-6)


def test_softmax_gpu_and_steady_figures_agree_with_independent_timers(evaluated, timers):
    import torch
    result, src, cache = evaluated("softmax@v0")
    assert result.status == "ok", result.message
    timing = result.details.get("timing") or {}
    missing = [k for k in ("gpu_ms", "steady_ms") if not isinstance(timing.get(k), (int, float))]
    assert not missing, f"the evaluator reports no {missing} in details['timing']: {sorted(timing)}"

    notes: list[str] = []
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    _, model, input_sets = timers.build(tasks.get("softmax@v0"), src, "cuda", cache, notes)
    assert model is not None, notes
    with torch.no_grad():
        timers.warm_up(model, input_sets, "cuda")
        flush = torch.empty(timers.flush_bytes() // 4, dtype=torch.float32, device="cuda")
        gpu_ms = timers.hidden_launch_ms(model, input_sets, flush, samples=60)
        del flush
        steady_ms, _ = timers.steady_ms(model, input_sets, "cuda")  # best of 8 passes, 0.5 s apart
    print(f"\nsoftmax@v0 candidate: evaluator gpu_ms {timing['gpu_ms']:.4f} vs {gpu_ms:.4f} here; "
          f"steady_ms {timing['steady_ms']:.4f} (passes {timing.get('steady_passes_ms')}) vs {steady_ms:.4f} "
          f"here; {notes}")
    assert timing["gpu_ms"] == pytest.approx(gpu_ms, rel=0.10)
    assert 0.9 * steady_ms <= timing["steady_ms"] <= 1.5 * steady_ms

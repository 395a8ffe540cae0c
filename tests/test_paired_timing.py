"""The speedup under load: five evaluations of one candidate on a busy machine agree (CPU, no GPU needed).

A busy process started by the test loads a core for the whole measurement, as another user's job would; one
Evaluator evaluates the same honest candidate (the reference's function in functional ops: a true speedup
near 1) five times. On the CPU the parent times each side by its own CPU time (all its threads), read from the
kernel, in batches that alternate between the candidate and the reference: load that takes the core from
either side adds nothing to that side's clock, and what is left (caches shared with the busy process) moves
both sides of every pair alike. The bound: five speedups within 5% of each other.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
REFERENCE = (HERE / "candidates_cpu" / "reference_small.py").read_text()
HONEST = (HERE / "candidates_cpu" / "honest_torch.py").read_text()


@pytest.mark.slow
def test_paired_speedup_is_steady_under_load(tmp_path):
    import evaluate_kernel as ek
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        with ek.Evaluator(REFERENCE, device="cpu", cache_dir=str(tmp_path)) as ev:
            results = [ev.evaluate(HONEST) for _ in range(5)]
    finally:
        busy.kill()
        busy.wait()
    assert all(r.status == "ok" for r in results), [r.message for r in results]
    speedups = [r.speedup for r in results]
    drifts = [r.details["baseline_drift"] for r in results]
    print(f"\nspeedups {[round(s, 4) for s in speedups]}, intervals {[r.details['speedup_ci'] for r in results]}, "
          f"drift from the start {[f'{d:+.1%}' for d in drifts]}")
    assert all(0.8 <= s <= 1.25 for s in speedups), speedups
    assert max(speedups) / min(speedups) - 1 <= 0.05, speedups
    for r in results:   # both sides are on record, measured in the same minutes
        t = r.details["timing"]
        assert r.baseline_ms > 0 and r.details["baseline_start_ms"] > 0
        assert len(t["batches_ref_ms"]) == len(t["batches_cand_ms"]) + 1

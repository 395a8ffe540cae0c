"""The speedup comes from a paired measurement: on a loaded machine it stays put (CPU, no GPU needed).

A busy process started by the test loads one core for the whole measurement, as another user's job would; one
Evaluator evaluates the same honest candidate (the reference's function in functional ops: a true speedup near
1) five times. Each evaluation times the reference in blocks between the candidate's, so both see the same
load. A baseline measured once spreads speedups by the machine's drift itself (2-4x on this machine class:
0.16-0.53x for an equivalent candidate). What the pair leaves is noise of each evaluation's own, up to 15-20%
on these 2-core VMs, whose speed moved up to 2x between the reference's blocks of one evaluation here (CI:
0.84, 1.17, 1.00, 1.01, 0.91 while the reference drifted -9% to -30%; here, 16 evaluations with and without
the load: 0.81-1.13). So the bounds: every speedup within 0.7-1.4, the middle three of five within 15% of each
other.
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
    print(f"\nspeedups {[round(s, 4) for s in speedups]}, drift from the start {[f'{d:+.1%}' for d in drifts]}")
    assert all(0.7 <= s <= 1.4 for s in speedups), speedups
    middle = sorted(speedups)[1:-1]
    assert middle[-1] / middle[0] - 1 <= 0.15, speedups
    for r in results:   # the pair is what the speedup is made of, and both sides are on record
        assert r.baseline_ms == pytest.approx(r.details["reference_timing"]["runtime_ms"])
        assert r.details["baseline_start_ms"] > 0 and len(r.details["reference_timing"]["blocks_ms"]) == 5

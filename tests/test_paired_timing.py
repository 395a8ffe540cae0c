"""The speedup comes from a paired measurement: on a loaded machine it stays put (CPU, no GPU needed).

A busy process started by the test loads one core for the whole measurement, as another user's job would;
one Evaluator evaluates the same honest candidate five times. Each evaluation times the reference in
blocks between the candidate's, so both see the same load: the speedups agreed within 4.7% in two runs
of five on the 2-core machine while the reference itself moved from +27% to -15% of its start figure (a
baseline measured once moved speedups by 2-4x there). But each evaluation runs in a fresh process, and on
a busy afternoon one evaluation in five or six read 10-20% apart from the others (six runs at 08:5x, the
reference drifting from -40% to +61%: all five within 3.5-24%, the middle three within 2.4-7.3%). So the
bound: the middle three of five within 10% (a baseline measured once spreads them by the drift itself).
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
    middle = sorted(speedups)[1:-1]
    assert middle[-1] / middle[0] - 1 <= 0.10, speedups
    for r in results:   # the pair is what the speedup is made of, and both sides are on record
        assert r.baseline_ms == pytest.approx(r.details["reference_timing"]["runtime_ms"])
        assert r.details["baseline_start_ms"] > 0 and len(r.details["reference_timing"]["blocks_ms"]) == 5

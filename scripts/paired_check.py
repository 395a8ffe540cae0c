"""How steady is one candidate's speedup, evaluation after evaluation, with or without load? (BENCHMARKS.md)

Evaluates the same candidate --repeats times with one Evaluator and prints, per evaluation, the
candidate's and the reference's time per call (measured in the same minutes), the speedup with its 95%
interval, the pairs of batches it took, the drift of the reference from the baseline measured at start
and the evaluation's wall time; then the speedups' spread (max / min - 1). With --load N, N busy processes
(a Python loop each) run for the whole measurement, as a loaded machine would.

    python3 scripts/paired_check.py --task conv_groupnorm --candidate tests/kernels/conv_groupnorm_fused.py
    python3 scripts/paired_check.py --device cpu --reference tests/candidates_cpu/reference_small.py \
        --candidate tests/candidates_cpu/honest_torch.py --load 1

Without --candidate the reference itself, renamed ModelNew, is the candidate (speedup ~1 by definition).
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import evaluate_kernel  # noqa: E402
import tasks  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", help="a task name (tasks.names()); or --reference")
    ap.add_argument("--reference", help="a KernelBench-format reference file")
    ap.add_argument("--candidate", help="the candidate file (default: the reference as ModelNew)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--load", type=int, default=0, help="busy processes running meanwhile")
    args = ap.parse_args()
    if args.task:
        task = tasks.get(args.task)
        ev = evaluate_kernel.Evaluator.for_task(task, device=args.device, gpus=[0] if args.device == "cuda" else None,
                                                cache_dir=tempfile.mkdtemp())
        ref_src = task.reference_src
    else:
        ref_src = open(args.reference).read()
        ev = evaluate_kernel.Evaluator(ref_src, device=args.device, cache_dir=tempfile.mkdtemp())
    src = open(args.candidate).read() if args.candidate else re.sub(r"\bModel\b", "ModelNew", ref_src)
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.load)]
    speedups = []
    try:
        print(f"baseline at start: {ev.baseline_ms():.4f} ms; load: {args.load} busy process(es)")
        print("| # | status | candidate ms | reference ms | speedup | 95% interval | pairs x calls | drift | wall s |\n"
              "|---|---|---|---|---|---|---|---|---|")
        for i in range(args.repeats):
            t0 = time.perf_counter()
            r = ev.evaluate(src)
            wall = time.perf_counter() - t0
            t = r.details.get("timing", {})
            if r.status == "ok":
                speedups.append(r.speedup)
            low, high = r.details.get("speedup_ci") or (None, None)
            print(f"| {i} | {r.status} | {_ms(r.runtime_ms)} | {_ms(r.baseline_ms)} | {r.speedup or 0:.4f} | "
                  f"{_ms(low)}-{_ms(high)} | {t.get('pairs')} x {t.get('calls_per_batch')} | "
                  f"{_pct(r.details.get('baseline_drift'))} | {wall:.1f} |", flush=True)
            if r.status != "ok":
                print("   ", r.message[:300])
    finally:
        for p in busy:
            p.kill()
        ev.close()
    if speedups:
        print(f"\nspeedups {', '.join(f'{s:.4f}' for s in speedups)}: spread {max(speedups) / min(speedups) - 1:.1%}")


def _ms(v) -> str:
    return f"{v:.4f}" if isinstance(v, (int, float)) else "n/a"


def _pct(v) -> str:
    return f"{v:+.1%}" if isinstance(v, (int, float)) else "n/a"


if __name__ == "__main__":
    main()

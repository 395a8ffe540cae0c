"""Does the evaluator's timing agree with an independent timer, with and without its spare runners? (issue 7)

No build needed: the candidate is the reference itself, renamed ModelNew, so every figure is the same
computation timed by (a) the evaluator with its default options, (b) the evaluator with
warm_runners=False (a cold runner per evaluation, no spare processes), and (c) bench_eval.py's
independent in-process CUDA-event + L2-flush timer, before and after.

    python3 scripts/timing_check.py [--repeats 5]
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import bench_eval  # noqa: E402
import evaluate_kernel  # noqa: E402
import tasks  # noqa: E402


def evaluator_runs(task, repeats: int, **options) -> tuple[float, list[float], list[float]]:
    restated = re.sub(r"\bModel\b", "ModelNew", task.reference_src)
    with evaluate_kernel.Evaluator.for_task(task, gpus=[0], cache_dir=tempfile.mkdtemp(), **options) as ev:
        base = ev.baseline_ms(0)
        runtimes, walls = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            r = ev.evaluate(restated)
            walls.append(time.perf_counter() - t0)
            runtimes.append(r.runtime_ms if r.status == "ok" else float("nan"))
    return base, runtimes, walls


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--task", default="conv_groupnorm")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    task = tasks.get(args.task)
    before, _ = bench_eval.independent_measurement(task, None)
    print(f"| timer | baseline ms | restated reference, each evaluation ms | spread | wall s each |\n|---|---|---|---|---|")
    print(f"| independent (before) | {before:.3f} | | | |")
    for label, opts in (("evaluator, default", {}), ("evaluator, warm_runners=False", {"warm_runners": False})):
        base, runs, walls = evaluator_runs(task, args.repeats, **opts)
        med = statistics.median(runs)
        spread = (max(runs) - min(runs)) / med
        print(f"| {label} | {base:.3f} | {', '.join(f'{x:.3f}' for x in runs)} | {100 * spread:.1f}% | "
              f"{', '.join(f'{w:.1f}' for w in walls)} |", flush=True)
    after, _ = bench_eval.independent_measurement(task, None)
    print(f"| independent (after) | {after:.3f} | | | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

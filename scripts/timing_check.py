"""Does the evaluator's timing agree with an independent timer, and what changes it? (issue 7)

No build needed: the candidate is the reference itself, renamed ModelNew, so every figure is the same
computation timed by the evaluator under each --config (Evaluator options; by default its defaults and
warm_runners=False, i.e. a cold runner per evaluation and no spare processes) and by bench_eval.py's
independent in-process CUDA-event + L2-flush timer, before and after.

    python3 scripts/timing_check.py [--repeats 5] [--config default --config inputs_on_device=False ...]
"""
from __future__ import annotations

import argparse
import ast
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


def parse_config(text: str) -> dict:
    """"warm_runners=False,prepare_bytes=0" -> Evaluator options ("" or "default": none)."""
    opts = {}
    for part in filter(None, text.replace("default", "").split(",")):
        key, value = part.split("=", 1)
        opts[key.strip()] = ast.literal_eval(value.strip())
    return opts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--task", default="conv_groupnorm")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--config", action="append", help='Evaluator options to compare, e.g. "default", '
                    '"warm_runners=False", "inputs_on_device=False,prepare_bytes=0" (repeatable)')
    args = ap.parse_args()
    configs = args.config or ["default", "warm_runners=False"]
    task = tasks.get(args.task)
    before, _ = bench_eval.independent_measurement(task, None)
    print(f"| timer | baseline ms | restated reference, each evaluation ms | spread | wall s each |\n|---|---|---|---|---|")
    print(f"| independent (before) | {before:.3f} | | | |")
    for label, opts in ((f"evaluator, {c}", parse_config(c)) for c in configs):
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

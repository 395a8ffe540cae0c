"""Benchmark of the evaluator's start-up and per-candidate cost on the CPU, with builders and runners
forked from the fork server and started by exec (BENCHMARKS.md, session 14): an Evaluator's start, its
first verdict and the median of N cached evaluations of one candidate, beside `python -c "import torch"`
on the same machine (the bar a cached CPU evaluation should beat). About a minute on a 2-core machine.

    python3 scripts/bench_cpu_eval.py [--rounds 2] [--cached 5]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import evaluate_kernel as ek  # noqa: E402

REFERENCE = os.path.join(ROOT, "tests", "candidates_cpu", "reference_small.py")
CANDIDATE = os.path.join(ROOT, "tests", "candidates_cpu", "honest_torch.py")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2, help="rounds, each with the fork server on, then off")
    ap.add_argument("--cached", type=int, default=5, help="cached evaluations per Evaluator")
    args = ap.parse_args()
    ref, cand = open(REFERENCE).read(), open(CANDIDATE).read()
    imports = []
    for _ in range(5):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import torch"], check=True)
        imports.append(time.perf_counter() - t)
    print(f"python -c 'import torch': median {statistics.median(imports):.2f} s ({_list(imports)})")
    print("| fork server | Evaluator start | first verdict | cached evaluation, median (each) | runner_start | speedup |")
    print("|---|---|---|---|---|---|")
    for rnd in range(args.rounds):
        for fork_server in (True, False):
            t0 = time.perf_counter()
            with ek.Evaluator(ref, device="cpu", cache_dir=tempfile.mkdtemp(prefix="pacevolve-bench-"),
                              fork_server=fork_server) as ev:
                start = time.perf_counter() - t0
                t = time.perf_counter()
                r = ev.evaluate(cand)
                first = start + time.perf_counter() - t
                cached = []
                for _ in range(args.cached):
                    t = time.perf_counter()
                    r = ev.evaluate(cand)
                    cached.append(time.perf_counter() - t)
                started = r.details.get("phases", {}).get("runner_start", float("nan"))
                print(f"| {ev.fork_server}, round {rnd} | {start:.2f} s | {first:.2f} s | "
                      f"{statistics.median(cached):.2f} s ({_list(cached)}) | {started:.2f} s | {r.speedup:.3f} |",
                      flush=True)
    return 0


def _list(xs: list[float]) -> str:
    return ", ".join(f"{x:.2f}" for x in xs)


if __name__ == "__main__":
    sys.exit(main())

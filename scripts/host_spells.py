"""Are the host's slow spells one core's or the whole machine's? (DESIGN.md, "The host's slow spells";
BENCHMARKS.md records what it finds on a GPU machine)

On the H100 machines lent here a loop of Python on one core took 76-97 us for seconds at a time and then
115-230 us, and launch-bound calls followed it. The evaluator's loop (steps.host_loop) runs on the core
the candidate ran on, where the candidate can slow it; a loop on another core could not be steered, but
tells the runners' spells only if the spells are the machine's. This script answers that: one process
per core, each pinned, each timing the evaluator's loop every --period-ms for --seconds (a 1% duty, so
the machine stays as quiet as an evaluation leaves it), all on one clock. It prints each core's share of
slow loops (more than 25% over its own steady loop, steps.host_loop's tenth quantile) and, for each
pair of cores, how often one was slow when the other was (the slow loops' agreement, against what
independent cores would give).

    python3 scripts/host_spells.py [--seconds 20] [--period-ms 10] [--cores 0,7,15]
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from evaluate_kernel import clock  # noqa: E402
from evaluate_kernel.steps import host_loop  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--period-ms", type=float, default=10.0)
    ap.add_argument("--cores", default="", help="comma-separated cores (default: all of this process's)")
    args = ap.parse_args()
    cores = sorted(int(c) for c in args.cores.split(",") if c.strip()) or sorted(os.sched_getaffinity(0))
    start = time.monotonic() + 1.0   # every process begins on the same tick
    with mp.get_context("spawn").Pool(len(cores)) as pool:
        series = pool.starmap(sample, [(c, start, args.seconds, args.period_ms / 1e3) for c in cores])
    print(report(dict(zip(cores, series)), args.period_ms / 1e3))
    return 0


def sample(core: int, start: float, seconds: float, period: float) -> list[float | None]:
    """The loop's seconds on `core`, one per period from `start` (None where a tick was missed)."""
    ticks = int(seconds / period)
    out: list[float | None] = [None] * ticks
    for k in range(ticks):
        due = start + k * period
        wait = due - time.monotonic()
        if wait < -period / 2:
            continue   # late by half a period: this tick is lost, not shifted onto the next
        if wait > 0:
            time.sleep(wait)
        out[k] = host_loop([core])
    return out


def report(series: dict[int, list[float | None]], period: float) -> str:
    """A table per core (steady loop, share slow), then each pair's agreement on slow ticks."""
    slow: dict[int, list[bool | None]] = {}
    lines = ["| core | steady loop us | slow share | ticks |", "|---|---|---|---|"]
    for core, xs in series.items():
        level = clock.steady_host(xs)
        limit = None if level is None else level * (1 + clock.HOST_SLACK)
        slow[core] = [None if x is None or limit is None else x > limit for x in xs]
        known = [s for s in slow[core] if s is not None]
        share = sum(known) / len(known) if known else float("nan")
        lines.append(f"| {core} | {level * 1e6 if level else float('nan'):.1f} | {share:.3f} | {len(known)} |")
    lines += ["", "| cores | both slow / either slow | if independent | ticks |", "|---|---|---|---|"]
    ordered = sorted(slow)
    for i, a in enumerate(ordered):
        for b in ordered[i + 1:]:
            both = [(x, y) for x, y in zip(slow[a], slow[b]) if x is not None and y is not None]
            if not both:
                continue
            pa, pb = (sum(x for x, _ in both) / len(both)), (sum(y for _, y in both) / len(both))
            either = sum(x or y for x, y in both)
            jaccard = sum(x and y for x, y in both) / either if either else float("nan")
            expected = pa * pb / (pa + pb - pa * pb) if pa + pb > 0 else float("nan")
            lines.append(f"| {a}, {b} | {jaccard:.3f} | {expected:.3f} | {len(both)} |")
    lines.append(f"\nA tick is {period * 1e3:.0f} ms. Machine-wide spells: both/either near 1 for every pair; "
                 "one core's: near the independent figure.")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())

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
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import bench_eval  # noqa: E402
from evaluate_kernel import timing as eval_timing  # noqa: E402
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
            if r.status != "ok":
                print(f"  evaluation {len(runtimes)}: {r.status}: {r.message[:300]}", flush=True)
    return base, runtimes, walls


def gpu_state() -> dict:
    """SM and memory clocks (MHz), temperature (C) and power (W) from nvidia-smi; {} without it."""
    fields = ["clocks.sm", "clocks.mem", "temperature.gpu", "power.draw"]
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits",
                              "-i", "0"], capture_output=True, text=True, timeout=10).stdout
        return dict(zip(["sm_mhz", "mem_mhz", "temp_c", "power_w"], (float(v) for v in out.split(","))))
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return {}


def drift(task, seconds: float) -> None:
    """The reference timed in rounds of 30 calls for `seconds`, by bench_eval's independent timer, in this
    one process: odd rounds reuse the same model and inputs, even rounds allocate them afresh. If the
    medians follow the clocks, the GPU's state moves; if only fresh allocations move, memory placement does."""
    def fresh():
        return bench_eval.reference_on_gpu(task)[1:]

    kept = fresh()
    print("| t s | allocation | median ms | SM MHz | mem MHz | temp C | power W |\n|---|---|---|---|---|---|---|")
    rows, t0, k = [], time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        same = k % 2 == 0
        model, inputs = kept if same else fresh()
        ms = bench_eval.independent_ms(model, inputs, trials=30)
        state = gpu_state()
        rows.append((same, ms))
        print(f"| {time.perf_counter() - t0:.1f} | {'same' if same else 'fresh'} | {ms:.4f} | "
              f"{state.get('sm_mhz', '')} | {state.get('mem_mhz', '')} | {state.get('temp_c', '')} | "
              f"{state.get('power_w', '')} |", flush=True)
        if not same:
            del model, inputs
        k += 1
    for label, want in (("same", True), ("fresh", False)):
        vals = [ms for same, ms in rows if same == want]
        if vals:
            print(f"{label} allocation: {len(vals)} rounds, medians {min(vals):.4f}-{max(vals):.4f} ms, "
                  f"spread {100 * (max(vals) - min(vals)) / statistics.median(vals):.1f}%")


def protocols(task, seconds: float) -> None:
    """Is the phase drift the host's or the GPU's? The reference in one process, rounds of 30 calls
    rotating three per-call protocols for `seconds`: "kb" is KernelBench's (flush, start event, call, end
    event); "spin" puts a 0.5 ms torch.cuda._sleep between the flush and the start event, so the whole call
    is queued before the GPU reaches it and the host's speed cannot show; "hold" does the same with the
    evaluator's lead (_GpuHold, every SM's warp slots held). Each round also reports the host's time to queue
    one call. If kb's medians move with the host time and the others stay put, the drift is the host's."""
    import torch
    _, model, inputs = bench_eval.reference_on_gpu(task)
    flush = torch.empty(256 * 2**20 // 4, dtype=torch.float32, device="cuda")
    cycles = eval_timing._spin_cycles_per_ms() * 0.5
    hold = eval_timing._GpuHold(torch.device("cuda:0"))
    leads = {"kb": lambda: None, "spin": lambda: torch.cuda._sleep(int(cycles)), "hold": lambda: hold(0.5)}

    def round_(lead) -> tuple[float, float]:
        samples, host = [], []
        for i in range(30):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            flush.zero_()
            lead()
            start.record()
            t0 = time.perf_counter()
            model(*inputs[i % 2])
            host.append((time.perf_counter() - t0) * 1e3)
            end.record()
            torch.cuda.synchronize()
            samples.append(start.elapsed_time(end))
        return statistics.median(samples), statistics.median(host)

    with torch.no_grad():
        for name in leads:
            round_(leads[name])
        rows, t0, k = [], time.perf_counter(), 0
        print("| t s | protocol | median ms | host queue ms |\n|---|---|---|---|")
        while time.perf_counter() - t0 < seconds:
            name = list(leads)[k % len(leads)]
            ms, host = round_(leads[name])
            rows.append((name, ms, host))
            print(f"| {time.perf_counter() - t0:.1f} | {name} | {ms:.4f} | {host:.4f} |", flush=True)
            k += 1
    for name in leads:
        vals = [(ms, host) for n, ms, host in rows if n == name]
        if len(vals) > 2:
            ms = [v[0] for v in vals]
            corr = statistics.correlation(ms, [v[1] for v in vals])
            print(f"{name}: {len(vals)} rounds, medians {min(ms):.4f}-{max(ms):.4f} ms (median {statistics.median(ms):.4f}), "
                  f"spread {100 * (max(ms) - min(ms)) / statistics.median(ms):.1f}%, stdev "
                  f"{100 * statistics.stdev(ms) / statistics.mean(ms):.2f}%, correlation with host time {corr:.2f}")


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
    ap.add_argument("--drift-s", type=float, default=0, help="first time the reference in one process for this "
                    "long, with the GPU's clocks, temperature and power (see drift())")
    ap.add_argument("--protocols-s", type=float, default=0, help="first compare two timing protocols in one "
                    "process for this long (see protocols())")
    args = ap.parse_args()
    configs = args.config or ([] if args.drift_s or args.protocols_s else ["default", "warm_runners=False"])
    task = tasks.get(args.task)
    if args.protocols_s:
        protocols(task, args.protocols_s)
    if args.drift_s:
        drift(task, args.drift_s)
    if not configs:
        return 0
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

"""--ray against a local Evaluator on one multi-GPU machine: candidates per hour and one candidate's speedup
(BENCHMARKS.md, "Ray against the local evaluator").

Both evaluate the same K distinct, already built candidates (the hand-written conv_groupnorm kernel in
tests/kernels/conv_groupnorm_fused.py with a harmless constant changed, as scripts/bench_eval.py does),
submitted at once from K threads, after one untimed pass (a long search's steady rate, not start-up):
  1. local: evaluate_kernel.Evaluator over all visible GPUs;
  2. Ray: a Ray head started here (ray.init(num_gpus=N), on this machine alone) and
     ray_evaluator.RayEvaluator, one actor per GPU, sharing the same build cache folder;
  3. the first candidate evaluated R more times under each: the median speedup of each.
Targets: Ray's candidates per hour within 10% of local's, its speedup within 1%. Writes a markdown table
to stdout and --out. Takes about 3-5 minutes on a 2 x H200 machine (K=8, R=3).

    pip install -r requirements-ray.txt
    python3 scripts/bench_ray.py --out runs/bench_ray.md
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import torch  # noqa: E402

import evaluate_kernel  # noqa: E402
import tasks  # noqa: E402
from bench_eval import FUSED, variant  # noqa: E402


def steady_rate(ev, sources: list[str]) -> dict:
    """One untimed pass, then the timed one: K sources from K threads."""
    with cf.ThreadPoolExecutor(len(sources)) as pool:
        list(pool.map(ev.evaluate, sources))
        t0 = time.perf_counter()
        results = list(pool.map(ev.evaluate, sources))
    wall = time.perf_counter() - t0
    return {"per_hour": len(sources) / wall * 3600, "wall_s": wall,
            "ok": sum(r.status == "ok" for r in results), "statuses": sorted({r.status for r in results})}


def speedups(ev, src: str, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        r = ev.evaluate(src)
        if r.status != "ok":
            raise SystemExit(f"bench_ray.py: the candidate was {r.status}: {r.message[:300]}")
        out.append(r.speedup)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(ROOT, "runs", "bench_ray.md"))
    ap.add_argument("--k", type=int, default=8, help="distinct candidates submitted at once")
    ap.add_argument("--repeats", type=int, default=3, help="evaluations of one candidate for its speedup")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench_ray.py needs a CUDA GPU", file=sys.stderr)
        return 2
    try:
        import ray
        from driver import ray_evaluator
    except ImportError as e:
        print(f"bench_ray.py needs Ray ({e}): pip install -r requirements-ray.txt", file=sys.stderr)
        return 2

    n = torch.cuda.device_count()
    task = tasks.get("conv_groupnorm")
    with open(FUSED) as f:
        src = f.read()
    sources = [variant(src, 1 + i) for i in range(args.k)]
    cache = tempfile.mkdtemp(prefix="pacevolve_bench_ray_")
    rows: list[tuple[str, str]] = []
    add = lambda k, v: (rows.append((k, v)), print(f"{k}: {v}", flush=True))
    add("date", datetime.datetime.now().strftime("%Y-%m-%d %H:%M"))
    add("GPU", f"{torch.cuda.get_device_name(0)} x{n}")
    add("versions", f"torch {torch.__version__}, CUDA {torch.version.cuda}, Ray {ray.__version__}, "
                    f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    started = time.perf_counter()

    with evaluate_kernel.Evaluator.for_task(task, cache_dir=cache) as ev:   # every visible GPU
        for g in range(n):
            ev.baseline_ms(g)
        local = steady_rate(ev, sources)
        local_speedups = speedups(ev, sources[0], args.repeats)
    add(f"local Evaluator, {n} GPUs", f"{local['per_hour']:.0f} candidates/hour ({args.k} built candidates, "
                                      f"{local['wall_s']:.1f} s wall, {local['ok']}/{args.k} ok)")

    t0 = time.perf_counter()
    ray.init(num_gpus=n, include_dashboard=False, logging_level="WARNING", log_to_driver=False,
             object_store_memory=1 << 30,   # results are small; /dev/shm may be too
             runtime_env=ray_evaluator.runtime_env())
    try:
        with ray_evaluator.RayEvaluator.for_task(task, address="auto", cache_dir=cache) as rev:
            add("Ray start-up", f"{time.perf_counter() - t0:.1f} s (head, {len(rev.slots)} actors up)")
            for i in range(len(rev.slots)):
                rev.baseline_ms(i)
            remote = steady_rate(rev, sources)
            ray_speedups = speedups(rev, sources[0], args.repeats)
            add("Ray actors", "; ".join(f"{a['name']} GPU {a['gpu_ids']} pid {a['pid']}"
                                        for a in rev.actor_infos()))
    finally:
        ray.shutdown()
    add(f"--ray, {n} actors", f"{remote['per_hour']:.0f} candidates/hour ({args.k} built candidates, "
                              f"{remote['wall_s']:.1f} s wall, {remote['ok']}/{args.k} ok)")
    ratio = remote["per_hour"] / local["per_hour"]
    add("throughput, Ray / local", f"{ratio:.3f} (target >= 0.90)")
    a, b = statistics.median(local_speedups), statistics.median(ray_speedups)
    add("speedup of one candidate, local vs Ray",
        f"{a:.3f}x ({', '.join(f'{s:.3f}' for s in local_speedups)}) vs {b:.3f}x "
        f"({', '.join(f'{s:.3f}' for s in ray_speedups)}): {100 * abs(b - a) / a:.2f}% apart (target <= 1%)")
    add("benchmark wall time", f"{time.perf_counter() - started:.0f} s")
    table = "| measurement | value |\n|---|---|\n" + "".join(f"| {k} | {v} |\n" for k, v in rows)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write("# --ray against a local Evaluator (scripts/bench_ray.py)\n\n" + table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark of the evaluator itself on a GPU machine: where a candidate's evaluation time goes, how
repeatable and how accurate its timing is, and how many candidates per hour it gets through (BENCHMARKS.md:
"Cost per candidate and timing quality", the sessions' GPU figures, "2 GPUs").

Uses only evaluate_kernel's public API (Evaluator.for_task, .baseline_ms, .evaluate, .close) and the
hand-written conv_groupnorm candidate in tests/kernels/conv_groupnorm_fused.py. Reports:
  1. cold evaluation (fresh cache dir), a new source and a cached re-evaluation of the same source: wall
     time, split into the build and the run's phases (EvalResult.details["build_wall_s"] and ["phases"]),
     the timing into its batches' steps and the rest, as a table with each one's three biggest costs;
  2. repeatability: the same source evaluated 5 times, spread of the 5 medians;
  3. agreement with an independent measurement done here, in this process, by KernelBench's timer (CUDA
     events around each call, an L2 flush before it, median of 50), for the reference and the candidate;
  4. throughput: K distinct candidates (the fused kernel with a harmless constant changed, so each needs
     its own build) submitted at once from K threads, new and then built (after a first build has stored
     torch's header and the .cu's precompiled prefix, as a search's first candidate does), with
     Evaluator(gpus=[0]) and, where there are several GPUs, with all of them (other new sources), their
     ratio to linear scaling, and the same candidate's speedup on each GPU alone.
Writes a markdown table (date, GPU, torch/CUDA versions, every figure) to stdout and to --out.
Budget: about 2.5-8 minutes on one H100/H200 machine with 16 cores (K=6; 142 s on a fresh H200 with
--new 3 --repeats 3).

    python3 scripts/bench_eval.py --out runs/bench_eval.md
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime
import glob
import os
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

import evaluate_kernel  # noqa: E402
import tasks  # noqa: E402

FUSED = os.path.join(ROOT, "tests", "kernels", "conv_groupnorm_fused.py")


def variant(src: str, i: int) -> str:
    """The fused candidate with a different unused constant and extension name: same speed, new hash."""
    marker, name = "constexpr int kVariant = 0;", 'name="pacevolve_cg_fused"'
    assert src.count(marker) == 1 and src.count(name) == 1, "conv_groupnorm_fused.py changed its markers"
    return src.replace(marker, f"constexpr int kVariant = {i};").replace(name, f'name="pacevolve_cg_fused_v{i}"')


def ninja_steps(ext_dir: str) -> str:
    """Each target's start and end in ninja's own log (seconds from ninja's start), e.g. main.o 0.0-7.1."""
    out = []
    for log in glob.glob(os.path.join(ext_dir, "*", ".ninja_log")):
        for line in open(log).read().splitlines():
            parts = line.split("\t")
            if len(parts) >= 4 and not line.startswith("#"):
                out.append(f"{parts[3]} {int(parts[0]) / 1e3:.1f}-{int(parts[1]) / 1e3:.1f}")
    return ", ".join(out) or "no ninja log"


def split(result, cache_dir: str | None = None) -> str:
    """Where the wall time went: the build (with ninja's steps), then the run's phases."""
    d = result.details
    parts = []
    if isinstance(d.get("build_wall_s"), (int, float)):
        steps = f"; ninja: {ninja_steps(os.path.join(cache_dir, 'ext', d['source_hash']))}" if cache_dir else ""
        parts.append(f"build {d['build_wall_s']:.1f} s ({d.get('build_headers', 'real')} headers, binding header "
                     f"{'yes' if d.get('binding_header') else 'no'}; in the builder "
                     f"{d.get('compile_s', 0):.1f} s{steps})")
    elif d.get("build_cached"):
        parts.append("build cached")
    parts += [f"{k} {v:.2f} s" for k, v in (d.get("phases") or {}).items() if isinstance(v, (int, float))]
    return ", ".join(parts) if parts else "no split reported"


BATCH_STEPS = ("calls", "draw", "settle", "digest", "probe")


def cost_rows(result, wall_s: float) -> dict[str, float]:
    """Seconds per phase of one evaluation: the build, the run's phases, and the timing split into its
    batches' steps (summed over both sides) and the rest (shipping and checking outputs, stopping the
    runner, the exchanges between steps); "other" is the wall time no phase accounts for."""
    d = result.details
    rows: dict[str, float] = {}
    if isinstance(d.get("build_wall_s"), (int, float)):
        rows["build"] = float(d["build_wall_s"])
    split = d.get("trials_split_s") or {}
    for k, v in (d.get("phases") or {}).items():
        if isinstance(v, (int, float)) and k != "timing":
            if k == "trials" and split and all(isinstance(x, (int, float)) for x in split.values()):
                rows.update({f"trials: {part.replace('_', ' ')}": float(x) for part, x in split.items()})
            else:
                rows[k] = float(v)
    timing, t = (d.get("phases") or {}).get("timing"), d.get("timing") or {}
    if isinstance(timing, (int, float)):
        batches = (t.get("batches_ref_ms") or []) + (t.get("batches_cand_ms") or [])
        steps = {f"timing: {s}": sum(b.get(s, 0.0) for b in batches) / 1e3 for s in BATCH_STEPS}
        rows.update(steps)
        spent = {f"timing: {k}": float(v) for k, v in (d.get("timing_overhead_s") or {}).items()
                 if k in ("ship", "stop", "check")}
        rows.update(spent)
        rows["timing: exchanges, the rest"] = max(0.0, timing - sum(steps.values()) - sum(spent.values()))
    rows["other"] = max(0.0, wall_s - sum(rows.values()))
    return rows


def phase_table(runs: dict[str, tuple]) -> str:
    """Markdown: one column per evaluation (label -> (result, wall seconds)), one row per phase, then each
    column's three biggest costs."""
    costs = {label: cost_rows(r, w) for label, (r, w) in runs.items()}
    phases = list(dict.fromkeys(k for c in costs.values() for k in c))
    head = "| phase (s) | " + " | ".join(costs) + " |\n|---|" + "---|" * len(costs) + "\n"
    body = "".join(f"| {p} | " + " | ".join(f"{c[p]:.2f}" if p in c else "" for c in costs.values()) + " |\n"
                   for p in phases)
    total = "| wall | " + " | ".join(f"{w:.2f}" for _, w in runs.values()) + " |\n"
    top = "".join(f"- {label}: biggest costs " + ", ".join(f"{p} {v:.2f} s" for p, v in
                                                            sorted(c.items(), key=lambda kv: -kv[1])[:3]) + "\n"
                  for label, c in costs.items())
    return head + body + total + "\n" + top


def timed_evaluate(ev, src: str):
    t0 = time.perf_counter()
    result = ev.evaluate(src)
    return result, time.perf_counter() - t0


# ------------------------------------------------------------------------------------ independent timer

def independent_ms(fn, input_sets, trials: int = 50) -> float:
    """KernelBench's timer (src/kernelbench/timing.py, HEAD): synchronise, flush L2, start event, the call,
    end event, synchronise; median of `trials` calls after 5 warm-up calls."""
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 0) or 50 * 2**20
    flush = torch.empty(max(2 * l2, 256 * 2**20) // 4, dtype=torch.float32, device="cuda")
    with torch.no_grad():
        for i in range(5):
            fn(*input_sets[i % len(input_sets)])
        torch.cuda.synchronize()
        samples = []
        for i in range(trials):
            args = input_sets[i % len(input_sets)]
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            flush.zero_()
            start.record()
            fn(*args)
            end.record()
            torch.cuda.synchronize()
            samples.append(start.elapsed_time(end))
    del flush
    return statistics.median(samples)


def load_built(src: str, cache_dir: str) -> dict:
    """The candidate's namespace in this process, its load_inline calls importing the libraries the
    evaluator built (as its runner does), so the independent timer measures the same machine code."""
    from torch.utils import cpp_extension as ce
    ext = os.path.join(cache_dir, "ext", evaluate_kernel.source_hash(src)[:16])
    original = ce.load_inline
    ce.load_inline = lambda name, *a, **k: ce._import_module_from_library(name, os.path.join(ext, name), True)
    try:
        ns: dict = {"__name__": "bench_candidate"}
        exec(compile(src, "bench_candidate", "exec"), ns)
    finally:
        ce.load_inline = original
    return ns


def reference_on_gpu(task) -> tuple[list, torch.nn.Module, list]:
    """The task's reference in this process as KernelBench builds it (seed-42 weights, TF32 off), with two
    input sets: (init args, model, input sets)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    ref_ns: dict = {}
    exec(compile(task.reference_src, task.name, "exec"), ref_ns)
    torch.manual_seed(42)
    init = ref_ns["get_init_inputs"]()
    torch.manual_seed(42)
    model = ref_ns["Model"](*init).cuda()
    input_sets = []
    for s in range(2):
        torch.manual_seed(100 + s)
        input_sets.append([t.cuda() for t in ref_ns["get_inputs"]()])
    return init, model, input_sets


def independent_measurement(task, cand_ns) -> tuple[float, float | None]:
    init, ref, input_sets = reference_on_gpu(task)
    ref_ms = independent_ms(ref, input_sets)
    cand_ms = None
    if cand_ns is not None:
        torch.manual_seed(42)
        cand = cand_ns["ModelNew"](*init).cuda()
        cand_ms = independent_ms(cand, input_sets)
        del cand
    del ref, input_sets
    torch.cuda.empty_cache()
    return ref_ms, cand_ms


# ------------------------------------------------------------------------------------------- phases

def speedups_on(task, src: str, gpu: int, cache_dir: str, repeats: int, **opts) -> list[float]:
    """The same candidate's speedup, `repeats` evaluations on one GPU alone (the first builds it if the
    cache lacks it; builds are not timed); a run that is not ok is printed, and left out."""
    with evaluate_kernel.Evaluator.for_task(task, gpus=[gpu], cache_dir=cache_dir, **opts) as ev:
        results = [ev.evaluate(src) for _ in range(repeats)]
    for r in results:
        if r.status != "ok":
            print(f"  GPU {gpu}: {r.status}: {r.message[:200]}", flush=True)
    return [r.speedup for r in results if r.status == "ok"]


def throughput(task, sources: list[str], gpus: list[int], cache_dir: str, steady: bool, **opts) -> dict:
    """K sources submitted at once from K threads. steady=True first runs the same K evaluations untimed,
    so the figure is a long search's rate, not the start-up of a fresh evaluator (its spare runners)."""
    k = len(sources)
    with evaluate_kernel.Evaluator.for_task(task, gpus=gpus, cache_dir=cache_dir, **opts) as ev:
        for g in gpus:  # one-time baselines, not part of the per-candidate cost
            ev.baseline_ms(g)
        if steady:
            with cf.ThreadPoolExecutor(k) as pool:
                list(pool.map(ev.evaluate, sources))
        t0 = time.perf_counter()
        with cf.ThreadPoolExecutor(k) as pool:
            results = list(pool.map(ev.evaluate, sources))
        wall = time.perf_counter() - t0
    ok = sum(r.status == "ok" for r in results)
    return {"wall_s": wall, "per_hour": k / wall * 3600, "ok": ok, "k": k,
            "statuses": sorted({r.status for r in results})}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(ROOT, "runs", "bench_eval.md"))
    ap.add_argument("--k", type=int, default=6, help="distinct candidates per throughput round")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--new", type=int, default=3, help="new candidates evaluated one after another")
    ap.add_argument("--budget-s", type=float, default=450, help="skip phases that would start after this")
    ap.add_argument("--only-throughput", action="store_true", help="skip the single-candidate phases")
    ap.add_argument("--fork-server", choices=["on", "off"], default="on",
                    help="builders and runners forked from a process with torch imported, or started by exec")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench_eval.py needs a CUDA GPU", file=sys.stderr)
        return 2

    started = time.perf_counter()
    phases_md = ""
    over_budget = lambda: time.perf_counter() - started > args.budget_s
    task = tasks.get("conv_groupnorm")
    with open(FUSED) as f:
        src = f.read()
    all_gpus = list(range(torch.cuda.device_count()))
    work = tempfile.mkdtemp(prefix="pacevolve_bench_")
    rows: list[tuple[str, str]] = []
    add = lambda k, v: (rows.append((k, v)), print(f"{k}: {v}", flush=True))

    add("date", datetime.datetime.now().strftime("%Y-%m-%d %H:%M"))
    add("GPU", f"{torch.cuda.get_device_name(0)} x{len(all_gpus)}")
    add("versions", f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN "
                    f"{torch.backends.cudnn.version()}, Python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    add("task / candidate", "conv_groupnorm (KernelBench level2 #92) / tests/kernels/conv_groupnorm_fused.py")

    cache = os.path.join(work, "cache")
    t_start = time.perf_counter()
    opts = {"fork_server": args.fork_server == "on"}
    ev = evaluate_kernel.Evaluator.for_task(task, gpus=[0], cache_dir=cache, **opts)
    started_s = time.perf_counter() - t_start
    add("fork server", ev.fork_server)
    try:
        if not args.only_throughput:
            # The first candidate at once, as a search submits it.
            cold, cold_wall = timed_evaluate(ev, src)
            first_s = time.perf_counter() - t_start
            base = ev.baseline_ms(0)
            info = ev.baseline_info(0)
            add("Evaluator start (the constructor; on a GPU with cores for the runners the baseline comes after it)",
                f"{started_s:.1f} s (steps ended at, s: {ev.start_s}; the device's: {ev.devices[0].start_s}); "
                f"reference {base:.3f} ms per call; self-check (the reference timed as a "
                f"candidate) {info.get('self_check', float('nan')):.4f}x")
            add("cold evaluation (fresh cache)", f"{cold_wall:.1f} s wall ({split(cold, cache)}); status {cold.status}, "
                                                 f"{cold.runtime_ms} ms, speedup {cold.speedup}")
            add("first verdict of a fresh Evaluator", f"{first_s:.1f} s from the constructor's call (target <= 15 s)")
            # The first build on a machine also builds torch's precompiled header, and the binding header
            # comes after it (builds go without it meanwhile); later new sources show what every other
            # candidate costs.
            t_wait = time.perf_counter()
            binding = ev.builds.binding_header(wait=True)
            why = ev.builds.header_notes.get("binding", "")
            add("binding header (binding_header.py)", f"{binding or 'none: ' + why}; waited "
                                                      f"{time.perf_counter() - t_wait:.1f} s after the cold evaluation")
            # The cold build asked for its .cu's prefix (prefixes.py); a search's later candidates find it
            # stored, so the figures below wait for it.
            t_wait = time.perf_counter()
            settled = ev.builds.prefixes_settled(timeout_s=120)
            add("precompiled prefix", f"{'stored' if settled else 'still precompiling'} "
                                      f"{time.perf_counter() - t_wait:.1f} s after the binding header "
                                      f"({ev.builds.header_notes.get('prefix', 'no failure noted')})")
            fresh_walls = []
            for i in range(args.new):
                fresh, fresh_wall = timed_evaluate(ev, variant(src, 90 + i))
                fresh_walls.append(fresh_wall)
                print(f"  new candidate: {fresh_wall:.1f} s wall ({split(fresh, cache)}); status {fresh.status}", flush=True)
            if fresh_walls:
                add(f"new candidate, median of {len(fresh_walls)} (precompiled header already built)",
                    f"{statistics.median(fresh_walls):.1f} s wall (each: {', '.join(f'{w:.1f}' for w in fresh_walls)} s; "
                    f"last: {split(fresh)}); status {fresh.status} (target <= 20 s)")
            cached, cached_wall = timed_evaluate(ev, src)
            add("cached evaluation (same source again)", f"{cached_wall:.1f} s wall ({split(cached)}); status {cached.status}")
            add("GPU timing protocol", str((cached.details or {}).get("gpu_protocol")))
            runs = {"cold": (cold, cold_wall), "new": (fresh, fresh_wall)} if fresh_walls else {"cold": (cold, cold_wall)}
            phases_md = phase_table(dict(runs, cached=(cached, cached_wall)))
            print("\nwhere the time goes\n" + phases_md, flush=True)

            runtimes, speedups, walls = [], [], []
            for _ in range(args.repeats):
                r, w = timed_evaluate(ev, src)
                walls.append(w)
                t = r.details.get("timing") or {}
                print(f"  repeat: {r.runtime_ms} ms, speedup {r.speedup} (interval {r.details.get('speedup_ci')}, "
                      f"{t.get('pairs')} pairs of {t.get('calls_per_batch')} calls), {w:.2f} s wall ({split(r)})",
                      flush=True)
                if r.runtime_ms:
                    runtimes.append(r.runtime_ms)
                    speedups.append(r.speedup)
            if runtimes:
                med = statistics.median(runtimes)
                spread = (max(runtimes) - min(runtimes)) / med
                note = " (all identical: results may be cached, not re-timed)" if len(set(runtimes)) == 1 else ""
                s_spread = (max(speedups) - min(speedups)) / statistics.median(speedups)
                add(f"repeatability ({args.repeats} evaluations)",
                    f"runtimes {', '.join(f'{x:.4f}' for x in runtimes)} ms (spread {100 * spread:.2f}%); speedups "
                    f"{', '.join(f'{x:.4f}' for x in speedups)} (spread {100 * s_spread:.2f}%, target <= 0.5%){note}; "
                    f"wall per evaluation, back to back: {', '.join(f'{w:.1f}' for w in walls)} s "
                    f"(median {statistics.median(walls):.1f} s, target <= 1.5 s)")

            evaluator_ref = ev.baseline_ms(0)
    finally:
        ev.close()
    if not args.only_throughput:
        # After close: the evaluator's spare processes (starting up, importing torch) would otherwise load
        # the CPU, and KernelBench's timer counts the host's delay to the first kernel.
        ref_ms, cand_ms = independent_measurement(task, load_built(src, cache))
        agree = lambda ours, theirs: f"{100 * abs(ours - theirs) / theirs:.1f}%"
        add("KernelBench's timer (L2 flushed, one call at a time) vs evaluator, reference",
            f"{ref_ms:.3f} vs {evaluator_ref:.3f} ms: {agree(ref_ms, evaluator_ref)} apart (another protocol: "
            f"scripts/bench_agreement.py times this one)")
        if cand_ms is not None and runtimes:
            add("KernelBench's timer vs evaluator, candidate", f"{cand_ms:.3f} vs {statistics.median(runtimes):.3f} ms: "
                                                               f"{agree(cand_ms, statistics.median(runtimes))} apart")

    # Throughput: K distinct sources submitted at once. The first round builds them (new candidates,
    # build-bound); the later rounds evaluate the same, already built sources again (re-checked and
    # re-timed, not cached results), which isolates what the GPUs add; they are timed after one untimed
    # pass, as in a long search.
    # With several GPUs the new round on all of them gets sources of its own (nothing of them built yet).
    sources = [variant(src, 1 + i) for i in range(args.k)]
    tp_cache = os.path.join(work, "cache_tp")
    rounds = [("1 GPU, new candidates", [0], sources), ("1 GPU, built candidates", [0], sources)]
    if len(all_gpus) > 1:
        rounds += [(f"{len(all_gpus)} GPUs, new candidates", all_gpus, [variant(src, 101 + i) for i in range(args.k)]),
                   (f"{len(all_gpus)} GPUs, built candidates", all_gpus, sources)]
    if not over_budget():   # torch's precompiled header and the .cu's prefix, made once by the first build:
        # not any round's, since a search makes them once in its hours
        with evaluate_kernel.Evaluator.for_task(task, gpus=[0], cache_dir=tp_cache, eager_baseline=False, **opts) as ev:
            ev.evaluate(variant(src, 999))
            ev.builds.prefixes_settled(timeout_s=120)
    per_hour = {}
    for label, gpus, srcs in rounds:
        if over_budget():
            add(f"throughput, {label}", "skipped: over the time budget")
            continue
        t = throughput(task, srcs, gpus, cache_dir=tp_cache, steady="built" in label, **opts)
        per_hour[label] = t["per_hour"]
        add(f"throughput, {label}", f"{t['per_hour']:.0f} candidates/hour ({t['k']} distinct sources "
                                    f"submitted at once, {t['wall_s']:.1f} s wall, {t['ok']}/{t['k']} ok, "
                                    f"statuses {t['statuses']})")
    if len(all_gpus) > 1:
        for kind in ("new", "built"):
            one, many = per_hour.get(f"1 GPU, {kind} candidates"), per_hour.get(f"{len(all_gpus)} GPUs, {kind} candidates")
            if one and many:
                add(f"multi-GPU scaling, {kind} candidates",
                    f"{many / one:.2f}x the candidates/hour of 1 GPU ({many / one / len(all_gpus):.2f} of linear; "
                    f"target within 10% of linear)")
        if not over_budget():
            per_gpu = {g: speedups_on(task, src, g, tp_cache, args.repeats, **opts) for g in all_gpus}
            med = {g: statistics.median(v) for g, v in per_gpu.items() if v}
            if len(med) < len(all_gpus):
                add("one candidate's speedup on each GPU", f"no ok evaluation on GPU(s) {sorted(set(all_gpus) - set(med))}")
            else:
                lo, hi = min(med.values()), max(med.values())
                add("one candidate's speedup on each GPU",
                    "; ".join(f"GPU {g}: {med[g]:.4f}x ({', '.join(f'{x:.4f}' for x in per_gpu[g])})" for g in med)
                    + f": {100 * (hi - lo) / lo:.2f}% apart (target within 1%)")
    else:
        add("throughput, all GPUs", "only 1 GPU visible: same as 1 GPU")
    add("benchmark wall time", f"{time.perf_counter() - started:.0f} s")

    table = "| figure | value |\n|---|---|\n" + "\n".join(
        f"| {k} | {v.replace('|', '/')} |" for k, v in rows) + "\n"
    print("\n" + table)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write("# Evaluator benchmark (scripts/bench_eval.py)\n\n" + table
                + (f"\n## Where the time goes\n\n{phases_md}" if phases_md else ""))
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Do the evaluator's three runtime figures agree with independent timers of the same callables?

For each problem (softmax@v0, mean@v0, maxpool@v0: launch-bound calls of 10-50 us on an H100/H200; and
conv_groupnorm, a GPU-bound call of 1.5-3.5 ms) the hand-written candidate in tests/kernels/ is evaluated
once by `evaluate_kernel.Evaluator` (public API only). After the Evaluator is closed, this process builds
the same callables itself (the reference `Model` and the candidate `ModelNew`, each seeded with 42 as
KernelBench does: seed, get_init_inputs, seed, construct; the candidate imports the library the
evaluator built, so both time the same machine code) and times them with three timers written here,
sharing no code with the evaluator:

  (a) GPU time, the host's launch latency hidden: L2 flush (a write of max(2 x L2, 256 MiB)), then
      torch.cuda._sleep for ~1 ms so the call is queued before the GPU reaches it, start event, the call,
      end event; median of 100 calls;
  (b) KernelBench's current protocol: synchronise, flush, start event, the call, end event, synchronise;
      median of 100 calls;
  (c) steady state: 4 pre-drawn input sets, 20 warm-up calls, then N calls back to back cycling through
      them (N such that a pass lasts >= 20 ms), one synchronise, host clock; best of 8 passes 0.5 s apart,
      per call, with the process's threads on one core (as the evaluator's runner);
  runtime = max(a, c), the evaluator's fitness definition.

It prints, and writes to --out, a markdown table: problem | figure | evaluator | independent |
difference %, for the candidate's and the reference's (a), (b), (c) and runtime, and the speedup
(reference runtime / candidate runtime). The evaluator's figures are read from EvalResult.details
["timing"] and ["reference_timing"] (keys gpu_ms, kernelbench_ms, steady_ms, runtime_ms); a key that an
evaluator build does not report prints "n/a". A candidate that fails prints its status and message.

--device cpu runs the same flow on the CPU (one thread, as the evaluator's workers) for a smoke test: the
candidate is then the reference itself renamed ModelNew, the problems are the three v0 ones and
conv_groupnorm_small, (a) is the 10th percentile of 100 single calls on the host clock (the evaluator's CPU
figure: load only adds time), (b) the same timer run again (on the CPU the evaluator's kernelbench_ms
equals its gpu_ms) and the runtime is (a), as the evaluator's on the CPU. The evaluator's workers run with
fixed glibc malloc thresholds (evaluate_kernel.Evaluator._env), without which the same model ran 2-3x
slower (conv_groupnorm_small: 1.86 ms in the evaluator, 4.4-4.8 ms without them, 05:48 on the 2-core
machine); glibc reads them at start, so with --device cpu this script starts itself again with them set.

Time: about 3-6 minutes on one H100/H200 machine with 16 cores (each problem: an Evaluator start, one
cold candidate build of 15-60 s, an evaluation of a few seconds, then ~5 s of independent timing);
about 3-4 minutes on a 2-core CPU with --device cpu.

    python3 scripts/bench_agreement.py --out /path/table.md
    python3 scripts/bench_agreement.py --device cpu --out /tmp/agreement_cpu.md
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import glob
import hashlib
import importlib.util
import math
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

import evaluate_kernel  # noqa: E402
import tasks  # noqa: E402

KERNELS = os.path.join(ROOT, "tests", "kernels")
GPU_PROBLEMS = {"softmax@v0": "softmax_v0", "mean@v0": "mean_v0", "maxpool@v0": "maxpool_v0",
                "conv_groupnorm": "conv_groupnorm_fused"}
CPU_PROBLEMS = ("softmax@v0", "mean@v0", "maxpool@v0", "conv_groupnorm_small")
FIGURES = {  # device -> (evaluator key, row label) in table order
    "cuda": (("gpu_ms", "(a) GPU time, launch hidden"), ("kernelbench_ms", "(b) KernelBench protocol"),
             ("steady_ms", "(c) back-to-back per call"), ("runtime_ms", "runtime = max(a, c)")),
    "cpu": (("gpu_ms", "(a) single call, host clock, 10th pct"), ("kernelbench_ms", "(b) = (a), timed again"),
            ("steady_ms", "(c) back-to-back per call"), ("runtime_ms", "runtime = (a)")),
}
SAMPLES = 100       # calls per median, timers (a) and (b)
SETS = 4            # pre-drawn input sets, cycled
WARMUP_CALLS = 20
WARMUP_MS = 100.0   # and at least this much warm-up work, so the GPU's clocks have ramped up
PASS_MS = 20.0      # timer (c): each back-to-back pass lasts at least this long
PASSES = 8
GAP_S = 0.5         # between two passes of (c)
LEAD_MS = 1.0       # timer (a): the GPU sleeps this long before the start event
CPU_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(256 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}  # as the workers


@dataclass
class Figures:
    gpu_ms: float
    kernelbench_ms: float
    steady_ms: float
    calls_per_pass: int
    gpu: bool = True

    @property
    def runtime_ms(self) -> float:
        return max(self.gpu_ms, self.steady_ms) if self.gpu else self.gpu_ms


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(ROOT, "runs", "bench_agreement.md"))
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--problems", default="", help="comma-separated subset of the problems (default: all)")
    args = ap.parse_args()
    if args.device == "cpu" and any(os.environ.get(k) != v for k, v in CPU_MALLOC.items()):
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **CPU_MALLOC})
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_agreement.py: no CUDA GPU here (use --device cpu for a smoke test)", file=sys.stderr)
        return 2
    chosen = list(GPU_PROBLEMS) if args.device == "cuda" else list(CPU_PROBLEMS)
    if args.problems:
        wanted = [p.strip() for p in args.problems.split(",") if p.strip()]
        unknown = [p for p in wanted if p not in chosen]
        if unknown:
            print(f"unknown problems {unknown}; known on {args.device}: {', '.join(chosen)}", file=sys.stderr)
            return 2
        chosen = wanted
    if args.device == "cpu":
        torch.set_num_threads(1)  # the evaluator's workers run with one thread (Options.cpu_threads)
    torch.backends.cuda.matmul.allow_tf32 = False  # the evaluator's default precision: fp32, no TF32
    torch.backends.cudnn.allow_tf32 = False

    started = time.perf_counter()
    work = tempfile.mkdtemp(prefix="pacevolve_agreement_")
    rows: list[tuple[str, float | None]] = []
    notes: list[str] = [f"date {datetime.datetime.now():%Y-%m-%d %H:%M}, {device_name(args.device)}, torch "
                        f"{torch.__version__}" + (f", CUDA {torch.version.cuda}" if args.device == "cuda" else "")]
    try:
        for name in chosen:
            print(f"== {name}", flush=True)
            try:
                rows += problem_rows(name, candidate_source(name, args.device), args.device,
                                     os.path.join(work, name.replace("@", "_")), notes)
            except Exception as e:  # noqa: BLE001 - one broken problem must not lose the others' figures
                notes.append(f"{name}: stopped: {type(e).__name__}: {str(e)[:300]}")
                print(notes[-1], flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    diffs = [(abs(d), line.split("|")[1].strip(), line.split("|")[2].strip()) for line, d in rows if d is not None]
    if diffs:
        worst = max(diffs)
        notes.append(f"largest |difference|: {worst[0]:.1f}% ({worst[1]}, {worst[2]}); "
                     f"{sum(d <= 5.0 for d, _, _ in diffs)} of {len(diffs)} figures within 5%")
    notes.append(f"wall time {time.perf_counter() - started:.0f} s")
    table = ("| problem | figure | evaluator | independent | difference % |\n|---|---|---|---|---|\n"
             + "".join(line for line, _ in rows) + "\n" + "".join(f"- {n}\n" for n in notes))
    print("\n" + table)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write("# Evaluator timing vs independent timers (scripts/bench_agreement.py)\n\n" + table)
    return 0


def candidate_source(name: str, device: str) -> str:
    """The hand-written candidate on a GPU; on the CPU the reference itself, renamed ModelNew."""
    if device == "cuda":
        with open(os.path.join(KERNELS, GPU_PROBLEMS[name] + ".py")) as f:
            return f.read()
    return re.sub(r"\bModel\b", "ModelNew", tasks.get(name).reference_src)


def problem_rows(name: str, src: str, device: str, cache_dir: str, notes: list[str]) -> list[tuple[str, float | None]]:
    """Evaluate the candidate `src`, close the Evaluator, time both callables here; the table rows
    (line, difference %)."""
    task = tasks.get(name)
    t0 = time.perf_counter()
    ev = evaluate_kernel.Evaluator.for_task(task, device=device, cache_dir=cache_dir,
                                            **({"gpus": [0]} if device == "cuda" else {}))
    try:
        result = ev.evaluate(src)
    finally:
        ev.close()
    notes.append(f"{name}: evaluator status {result.status}, {time.perf_counter() - t0:.1f} s with its start"
                 + (f": {result.message[:300]}" if result.message else ""))
    print(notes[-1], flush=True)
    ok = result.status == "ok"
    timing = result.details.get("timing") or {}
    reference_timing = result.details.get("reference_timing") or {}

    ref_model, cand_model, input_sets = build(task, src if ok else None, device, cache_dir, notes)
    ref = measure(ref_model, input_sets, device)
    cand = measure(cand_model, input_sets, device) if cand_model is not None else None
    notes.append(f"{name}: independent calls per back-to-back pass: reference {ref.calls_per_pass}"
                 + (f", candidate {cand.calls_per_pass}" if cand else ""))

    rows = []
    if cand is not None:
        for key, label in FIGURES[device]:
            ours = timing.get(key, result.runtime_ms if key == "runtime_ms" else None)
            rows.append(row(name, f"candidate {label} ms", ours, getattr(cand, key)))
    else:
        message = result.message[:200].replace("|", "/").replace("\n", " ")
        rows.append((f"| {name} | candidate | {result.status} | n/a | {message} |\n", None))
    for key, label in FIGURES[device]:
        ours = reference_timing.get(key, result.baseline_ms if key == "runtime_ms" and ok else None)
        rows.append(row(name, f"reference {label} ms", ours, getattr(ref, key)))
    if cand is not None:
        rows.append(row(name, "speedup (reference / candidate runtime)", result.speedup,
                        ref.runtime_ms / cand.runtime_ms, fmt="%.3fx"))
    return rows


def row(problem: str, figure: str, evaluator, independent: float, fmt: str = "%.4f") -> tuple[str, float | None]:
    """A table line, and the difference in percent (None when the evaluator gives no figure)."""
    known = isinstance(evaluator, (int, float)) and math.isfinite(evaluator) and independent > 0
    diff = 100 * (evaluator - independent) / independent if known else None
    return (f"| {problem} | {figure} | {fmt % evaluator if known else 'n/a'} | {fmt % independent} | "
            f"{'n/a' if diff is None else f'{diff:+.1f}'} |\n", diff)


# ------------------------------------------------------------------------------- the callables, here

def build(task, cand_src: str | None, device: str, cache_dir: str, notes: list[str]):
    """(reference model, candidate model or None, input sets) in this process, KernelBench's way:
    seed 42, get_init_inputs(), seed 42, construct; inputs from get_inputs() on the device."""
    ref_ns: dict = {"__name__": "reference"}
    exec(compile(task.reference_src, task.name, "exec"), ref_ns)  # noqa: S102 - our own task source
    torch.manual_seed(42)
    init = ref_ns["get_init_inputs"]()
    torch.manual_seed(42)
    ref_model = ref_ns["Model"](*init).to(device)
    cand_model = None
    if cand_src is not None:
        try:
            cand_ns = load_candidate(cand_src, cache_dir, notes)
            torch.manual_seed(42)
            cand_model = cand_ns["ModelNew"](*init).to(device)
        except Exception as e:  # noqa: BLE001 - measure the reference all the same
            notes.append(f"{task.name}: candidate not built in this process: {type(e).__name__}: {str(e)[:200]}")
    input_sets = []
    for k in range(SETS):
        torch.manual_seed(42 + k)
        with torch.device(device):
            input_sets.append([x.to(device) if isinstance(x, torch.Tensor) else x for x in ref_ns["get_inputs"]()])
    return ref_model, cand_model, input_sets


def load_candidate(src: str, cache_dir: str, notes: list[str]) -> dict:
    """The candidate's namespace; its load_inline calls import the library the evaluator built for this
    source when it is in cache_dir (<cache>/ext/<sha256[:16]>/<name>/<name>.so), else build it here."""
    from torch.utils import cpp_extension
    original = cpp_extension.load_inline
    digest = hashlib.sha256(src.encode()).hexdigest()[:16]

    def load_inline(name, *args, **kwargs):
        built = sorted(glob.glob(os.path.join(cache_dir, "ext", digest, name, name + "*.so")))
        if not built:
            notes.append(f"{name}: no library of the evaluator's found; built again in this process")
            return original(name, *args, **kwargs)
        spec = importlib.util.spec_from_file_location(name, built[0])
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    cpp_extension.load_inline = load_inline
    try:
        ns: dict = {"__name__": "candidate"}
        exec(compile(src, "candidate", "exec"), ns)  # noqa: S102 - our own candidate files
    finally:
        cpp_extension.load_inline = original
    return ns


# ------------------------------------------------------------------------------------------- timers

def measure(model, input_sets: list, device: str) -> Figures:
    """Timers (a), (b), (c) on one callable, after a warm-up of WARMUP_CALLS calls and WARMUP_MS."""
    with torch.no_grad():
        warm_up(model, input_sets, device)
        if device == "cuda":
            flush = torch.empty(flush_bytes() // 4, dtype=torch.float32, device="cuda")
            a = hidden_launch_ms(model, input_sets, flush)
            b = kernelbench_ms(model, input_sets, flush)
            del flush
        else:
            a = host_call_ms(model, input_sets)
            b = host_call_ms(model, input_sets)
        c, n = steady_ms(model, input_sets, device)
    return Figures(gpu_ms=a, kernelbench_ms=b, steady_ms=c, calls_per_pass=n, gpu=device == "cuda")


def hidden_launch_ms(fn, input_sets: list, flush: torch.Tensor, samples: int = SAMPLES) -> float:
    """(a): flush, ~LEAD_MS of torch.cuda._sleep, start event, the call, end event; median."""
    cycles = int(LEAD_MS * sleep_cycles_per_ms())
    times = []
    for i in range(samples):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        flush.fill_(float(i))
        torch.cuda._sleep(cycles)  # the GPU is busy while the host queues the call: its latency is hidden
        start.record()
        fn(*input_sets[i % len(input_sets)])
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def kernelbench_ms(fn, input_sets: list, flush: torch.Tensor, samples: int = SAMPLES) -> float:
    """(b): synchronise, flush, start event, the call, end event, synchronise; median."""
    times = []
    for i in range(samples):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        flush.fill_(float(i))
        start.record()
        fn(*input_sets[i % len(input_sets)])
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def host_call_ms(fn, input_sets: list, samples: int = SAMPLES) -> float:
    """(a) and (b) on the CPU: single calls on the host clock; 10th percentile."""
    times = []
    for i in range(samples):
        t0 = time.perf_counter()
        fn(*input_sets[i % len(input_sets)])
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.quantiles(times, n=10, method="inclusive")[0]


def steady_ms(fn, input_sets: list, device: str, passes: int = PASSES, pass_ms: float = PASS_MS) -> tuple[float, int]:
    """(c): N calls back to back cycling through the input sets, one synchronise, host clock; the best
    pass's time per call, and N. N comes from a first pass of WARMUP_CALLS calls, so a pass lasts >= pass_ms.

    All of this process's threads on one core meanwhile (as `taskset -c` would; the evaluator's runner has
    a core of its own): unpinned, the scheduler moving the thread between cores made a 10 us call's
    back-to-back cost 10-40% higher on the GPU machines. The passes are GAP_S apart, so they sample
    more than one of the host's phases of speed (they last about a second there)."""
    with one_core():
        first = _pass_ms(fn, input_sets, device, WARMUP_CALLS)
        n = max(WARMUP_CALLS, math.ceil(1.25 * pass_ms / max(first, 1e-6)))
        best = math.inf
        for _ in range(passes):
            time.sleep(GAP_S)
            for xs in input_sets:  # back into the caches after the gap
                fn(*xs)
            best = min(best, _pass_ms(fn, input_sets, device, n))
    return best, n


@contextlib.contextmanager
def one_core():
    """Every thread of this process on the last core this process may use, then back."""
    allowed = sorted(os.sched_getaffinity(0))
    tids = [int(t) for t in os.listdir("/proc/self/task")]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, allowed[-1:])
        except OSError:
            pass
    try:
        yield
    finally:
        for tid in tids:
            try:
                os.sched_setaffinity(tid, allowed)
            except OSError:
                pass


def _pass_ms(fn, input_sets: list, device: str, n: int) -> float:
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for i in range(n):
        fn(*input_sets[i % len(input_sets)])
    sync()
    return (time.perf_counter() - t0) * 1e3 / n


def warm_up(fn, input_sets: list, device: str) -> None:
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    t0, i = time.perf_counter(), 0
    while i < WARMUP_CALLS or (time.perf_counter() - t0) * 1e3 < WARMUP_MS:
        fn(*input_sets[i % len(input_sets)])
        i += 1
        if i % WARMUP_CALLS == 0:
            sync()
    sync()


def sleep_cycles_per_ms() -> float:
    """GPU clock cycles per millisecond of torch.cuda._sleep, measured now with events (median of 5)."""
    rates = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        torch.cuda._sleep(1_000_000)
        end.record()
        torch.cuda.synchronize()
        rates.append(1_000_000 / start.elapsed_time(end))
    return statistics.median(rates)


def flush_bytes() -> int:
    """max(2 x L2, 256 MiB): KernelBench's flush is a 256 MiB write; twice the L2 where that is larger."""
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) or 0
    return max(2 * l2, 256 << 20)


def device_name(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name(0)
    return f"CPU ({os.cpu_count()} cores visible, 1 thread used)"


if __name__ == "__main__":
    sys.exit(main())

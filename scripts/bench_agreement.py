"""Does the evaluator's timing agree with an independent timer of the same protocol? (BENCHMARKS.md)

For each problem (softmax@v0, mean@v0, maxpool@v0: launch-bound calls of 10-50 us on an H100/H200; and
conv_groupnorm, a GPU-bound call of 1.5-3.5 ms) the hand-written candidate in tests/kernels/ is evaluated by
`evaluate_kernel.Evaluator` (public API only). After each evaluation (--rounds of them, default 3, the
Evaluator idle between them), this process times the same callables itself (the reference `Model` and the
candidate `ModelNew`, seeded with 42 as KernelBench does; the candidate imports the library the evaluator
built, so both time the same machine code), with code written here, sharing none with the evaluator, by
the evaluator's definition of a call's time:

    n calls back to back on n input sets of their own (drawn before the clock starts; a model without
    hooks called by its forward, as the evaluator's runners call it), one synchronise,
    per call, the side's last batch's outputs freed first inside the window, as the runners free theirs; n = the evaluator's calls per batch on that side; batches alternate reference, candidate, reference ...
    (BATCHES of each), with every thread of this process on one core (CUDA's too, as in the evaluator's
    runner); the medians per side, and the median of the paired ratios.

On a GPU the clock is the host's monotonic clock; on the CPU (--device cpu: the candidate is the reference
renamed ModelNew) this process's CPU time, as the evaluator reads its workers'. It prints, and writes to
--out, a table: problem | figure | evaluator | independent | difference %, each figure the median over the
rounds. The rounds interleave the two timers because a launch-bound call follows the host's slow spells
(seconds long, each core's own; DESIGN.md): two timers run minutes apart disagree by the spell each fell in.

Time: about 4-6 minutes on one H100/H200 machine (an Evaluator start, a candidate build and three rounds
per problem); about 3 minutes on a 2-core CPU with --device cpu.

    python3 scripts/bench_agreement.py --out /path/table.md
    python3 scripts/bench_agreement.py --device cpu --out /tmp/agreement_cpu.md
"""
from __future__ import annotations

import argparse
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

import evaluate_kernel  # noqa: E402
import tasks  # noqa: E402

KERNELS = os.path.join(ROOT, "tests", "kernels")
GPU_PROBLEMS = {"softmax@v0": "softmax_v0", "mean@v0": "mean_v0", "maxpool@v0": "maxpool_v0",
                "conv_groupnorm": "conv_groupnorm_fused"}
CPU_PROBLEMS = ("softmax@v0", "mean@v0", "maxpool@v0", "conv_groupnorm_small")
BATCHES = 15        # per side, alternated; the first pair is a warm-up
ROUNDS = 3          # an evaluation, then the independent timer, this many times (medians compared)
CPU_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(256 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}  # as the workers


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(ROOT, "runs", "bench_agreement.md"))
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--problems", default="", help="comma-separated subset of the problems (default: all)")
    ap.add_argument("--rounds", type=int, default=ROUNDS, help="evaluations, each followed by the independent timer")
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
    torch.set_num_threads(1)  # the evaluator's workers run with one thread (Options.cpu_threads)
    torch.backends.cuda.matmul.allow_tf32 = False  # the evaluator's default precision: fp32, no TF32
    torch.backends.cudnn.allow_tf32 = False
    started = time.perf_counter()
    work = tempfile.mkdtemp(prefix="pacevolve_agreement_")
    rows: list[tuple[str, float | None]] = []
    notes = [f"date {datetime.datetime.now():%Y-%m-%d %H:%M}, {device_name(args.device)}, torch "
             f"{torch.__version__}" + (f", CUDA {torch.version.cuda}" if args.device == "cuda" else "")]
    try:
        for name in chosen:
            print(f"== {name}", flush=True)
            try:
                rows += problem_rows(name, candidate_source(name, args.device), args.device,
                                     os.path.join(work, name.replace("@", "_")), notes, max(1, args.rounds))
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
        f.write("# Evaluator timing vs an independent timer of the same protocol (scripts/bench_agreement.py)\n\n"
                + table)
    return 0


def candidate_source(name: str, device: str) -> str:
    """The hand-written candidate on a GPU; on the CPU the reference itself, renamed ModelNew."""
    if device == "cuda":
        with open(os.path.join(KERNELS, GPU_PROBLEMS[name] + ".py")) as f:
            return f.read()
    return re.sub(r"\bModel\b", "ModelNew", tasks.get(name).reference_src)


def problem_rows(name: str, src: str, device: str, cache_dir: str, notes: list[str],
                 rounds: int = ROUNDS) -> list[tuple[str, float | None]]:
    """`rounds` times: evaluate `src`, then time both callables here by the same protocol, on the core the
    runners use, right after; the table rows (line, difference %) from the medians over the rounds. A launch-
    bound call's speed follows the host's spells (DESIGN.md), so the two timers are compared over the same
    minutes, round by round, not one after the other."""
    task = tasks.get(name)
    t0 = time.perf_counter()
    ev = evaluate_kernel.Evaluator.for_task(task, device=device, cache_dir=cache_dir,
                                            **({"gpus": [0]} if device == "cuda" else {}))
    ours, theirs, models = [], [], None
    try:
        for k in range(rounds):
            result = ev.evaluate(src)
            if k == 0:
                notes.append(f"{name}: evaluator status {result.status}, {time.perf_counter() - t0:.1f} s with "
                             f"its start: {result.message[:200]}")
                print(notes[-1], flush=True)
            if result.status != "ok":
                message = result.message[:200].replace("|", "/").replace("\n", " ")
                return [(f"| {name} | candidate | {result.status} | n/a | {message} |\n", None)]
            n = int(result.details["timing"]["calls_per_batch"])
            n_ref = int(result.details["timing"].get("calls_per_reference_batch") or n)
            models = models or build(task, src, device, cache_dir)
            ref_ns, ref_model, cand_model = models
            theirs.append(alternate(ref_model, cand_model, ref_ns, n, device, n_ref=n_ref))
            ours.append((result.baseline_ms, result.runtime_ms, result.speedup))
            notes.append(f"{name}, round {k + 1}: {n} calls per candidate batch, {n_ref} per reference batch; "
                         f"evaluator {result.speedup:.4f}x {['%.4f' % v for v in result.details.get('speedup_ci') or []]}"
                         f", independent {theirs[-1][2]:.4f}x ({BATCHES} batches a side)")
            print(notes[-1], flush=True)
    finally:
        ev.close()
    med = [statistics.median(v) for v in zip(*ours)]
    ind = [statistics.median(v) for v in zip(*theirs)]
    return [row(name, "candidate ms per call", med[1], ind[1]),
            row(name, "reference ms per call", med[0], ind[0]),
            row(name, "speedup", med[2], ind[2], fmt="%.4fx")]


def row(problem: str, figure: str, evaluator, independent: float, fmt: str = "%.4f") -> tuple[str, float | None]:
    """A table line, and the difference in percent (None when the evaluator gives no figure)."""
    known = isinstance(evaluator, (int, float)) and math.isfinite(evaluator) and independent > 0
    diff = 100 * (evaluator - independent) / independent if known else None
    return (f"| {problem} | {figure} | {fmt % evaluator if known else 'n/a'} | {fmt % independent} | "
            f"{'n/a' if diff is None else f'{diff:+.1f}'} |\n", diff)


# ------------------------------------------------------------------------------- the callables, here

def build(task, cand_src: str, device: str, cache_dir: str):
    """(reference namespace, reference model, candidate model) in this process, KernelBench's way: seed
    42, get_init_inputs(), seed 42, construct."""
    ref_ns: dict = {"__name__": "reference"}
    exec(compile(task.reference_src, task.name, "exec"), ref_ns)  # noqa: S102 - our own task source
    torch.manual_seed(42)
    init = ref_ns["get_init_inputs"]()
    torch.manual_seed(42)
    ref_model = ref_ns["Model"](*init).to(device)
    cand_ns = load_candidate(cand_src, cache_dir)
    torch.manual_seed(42)
    return ref_ns, ref_model, cand_ns["ModelNew"](*init).to(device)


def load_candidate(src: str, cache_dir: str) -> dict:
    """The candidate's namespace; its load_inline calls import the library the evaluator built for this
    source when it is in cache_dir (<cache>/ext/<sha256[:16]>/<name>/<name>.so), else build it here."""
    from torch.utils import cpp_extension
    original = cpp_extension.load_inline
    digest = hashlib.sha256(src.encode()).hexdigest()[:16]

    def load_inline(name, *args, **kwargs):
        built = sorted(glob.glob(os.path.join(cache_dir, "ext", digest, name, name + "*.so")))
        if not built:
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


# ------------------------------------------------------------------------------------------- the timer

def alternate(ref_model, cand_model, ref_ns: dict, n: int, device: str,
              batches: int = BATCHES, n_ref: int | None = None) -> tuple[float, float, float]:
    """(reference ms per call, candidate ms per call, speedup): batches of n calls (the reference's of
    n_ref, if given) on fresh inputs, alternated, the first pair a warm-up; medians, and the median of the
    ratios of neighbouring batches."""
    n_ref = n if n_ref is None else n_ref
    ref, cand = [], []
    held_ref: list = []   # each side's last batch's outputs, freed inside its next batch
    held_cand: list = []
    cores = one_core()   # after CUDA's threads exist: all of them, as the runner's
    try:
        with torch.no_grad():
            for k in range(batches):
                ref.append(batch_ms(ref_model, ref_ns, n_ref, device, seed=2 * k, held=held_ref))
                cand.append(batch_ms(cand_model, ref_ns, n, device, seed=2 * k + 1, held=held_cand))
            ref.append(batch_ms(ref_model, ref_ns, n_ref, device, seed=2 * batches, held=held_ref))
            held_ref.clear()
            held_cand.clear()
    finally:   # the next problem's Evaluator inherits this process's cores (on one: its fixed cost read 9x)
        set_cores(cores)
    ratios = [(ref[i] + ref[i + 1]) / 2 / cand[i] for i in range(1, batches)]
    return statistics.median(ref[1:]), statistics.median(cand[1:]), statistics.median(ratios)


def batch_ms(model, ref_ns: dict, n: int, device: str, seed: int, held: list | None = None) -> float:
    """n calls back to back on n input sets drawn first, one synchronise; per call, in ms. With held (a
    list this side keeps between its batches): the last batch's outputs are freed first, inside the timed
    window, as the evaluator's runners do, and this batch's are left in held."""
    torch.manual_seed(seed)
    with torch.device(device):
        sets = [[x.to(device) if isinstance(x, torch.Tensor) else x for x in ref_ns["get_inputs"]()]
                for _ in range(n)]
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    clock = time.perf_counter if device == "cuda" else time.process_time
    # As the definition has it: a model without hooks of its own is called by its forward (nn.Module's
    # __call__ adds about 2.5 us a call on an H100's host, on both sides: a tenth of a 15 us softmax).
    fn = model.forward if isinstance(model, torch.nn.Module) and not _hooked(model) else model
    sync()
    t0 = clock()
    if held is not None:
        held.clear()
    outs = [fn(*xs) for xs in sets]
    sync()
    elapsed = clock() - t0
    if held is not None:
        held.extend(outs)
    del outs, sets
    return elapsed / n * 1e3


def _hooked(model) -> bool:
    """Whether calling the model runs hooks (its own, a submodule's does not count, or global ones)."""
    from torch.nn.modules import module as nn_module
    own = any(getattr(model, h, None) for h in ("_forward_hooks", "_forward_pre_hooks"))
    glob = any(getattr(nn_module, h, None) for h in ("_global_forward_hooks", "_global_forward_pre_hooks"))
    return bool(own or glob)


def one_core() -> set[int] | None:
    """Every thread of this process onto the last core of its affinity; the affinity it had."""
    try:
        cores = os.sched_getaffinity(0)
    except (AttributeError, OSError):
        return None
    set_cores({max(cores)})
    return cores


def set_cores(cores: set[int] | None) -> None:
    """Every thread of this process onto these cores."""
    if not cores:
        return
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cores)
        except OSError:
            pass   # a thread that ended meanwhile


def device_name(device: str) -> str:
    return torch.cuda.get_device_name(0) if device == "cuda" else f"CPU ({os.cpu_count()} cores)"


if __name__ == "__main__":
    sys.exit(main())

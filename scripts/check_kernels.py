"""Build, check and time the CUDA candidates in tests/kernels/ against their task references (GPU only); run
it when a kernel there is added or changed (docs/testing.md).

A standalone validation tool for the hand-written kernels (it does not use evaluate_kernel.py):
  1. builds every candidate at once, each in its own subprocess and extension directory;
  2. then, one at a time, each in a fresh subprocess: weights made KernelBench's way (seed 42 before each
     model), outputs compared with the reference on fresh inputs (the task's own, x3, negated, shifted)
     with TF32 off; both models timed with CUDA events around each call, a device-wide synchronise and an
     L2 flush before every call (median of --trials);
  3. prints one table row per candidate. A crash or hang in one candidate only fails its own row.

    TORCH_CUDA_ARCH_LIST=9.0 python3 scripts/check_kernels.py            # all candidates
    python3 scripts/check_kernels.py --only conv_groupnorm_fused --trials 50
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KERNELS = os.path.join(ROOT, "tests", "kernels")


@dataclass(frozen=True)
class Candidate:
    stem: str       # file name in tests/kernels without .py
    task: str       # tasks.get(task)
    expected: str   # "ok", "incorrect", "runtime_error"


CANDIDATES = (
    Candidate("conv_groupnorm_fused", "conv_groupnorm", "ok"),
    Candidate("conv_groupnorm_wrong_index", "conv_groupnorm", "incorrect"),
    Candidate("conv_groupnorm_oob", "conv_groupnorm", "runtime_error"),
    Candidate("multi_kernel_sequence", "conv_groupnorm", "ok"),
    Candidate("layernorm_fast", "layernorm", "ok"),
)


# ------------------------------------------------------------------------------------------ workers

def _exec_source(src: str, label: str) -> dict:
    namespace: dict = {"__name__": label}
    exec(compile(src, label, "exec"), namespace)
    return namespace


def worker_build(path: str) -> dict:
    """Executing a candidate runs its module-level load_inline: that is the build."""
    t0 = time.perf_counter()
    with open(path) as f:
        _exec_source(f.read(), os.path.basename(path))
    return {"build_s": time.perf_counter() - t0}


def _flush_l2(buf) -> None:
    buf.zero_()


def _time_ms(fn, input_sets, trials: int, flush) -> list[float]:
    import torch
    for i in range(3):
        fn(*input_sets[i % len(input_sets)])
    torch.cuda.synchronize()
    samples = []
    for i in range(trials):
        args = input_sets[i % len(input_sets)]
        flush()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(*args)
        torch.cuda.synchronize()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    return samples


def worker_check(path: str, task_name: str, trials: int) -> dict:
    import statistics
    import torch
    sys.path.insert(0, ROOT)
    import tasks

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    task = tasks.get(task_name)
    ref_ns = _exec_source(task.reference_src, task_name)
    t0 = time.perf_counter()
    with open(path) as f:
        cand_ns = _exec_source(f.read(), os.path.basename(path))
    load_s = time.perf_counter() - t0

    torch.manual_seed(42)
    init = ref_ns["get_init_inputs"]()
    torch.manual_seed(42)
    ref = ref_ns["Model"](*init).cuda()
    torch.manual_seed(42)
    cand = cand_ns["ModelNew"](*init).cuda()

    # Input variants: the task's own distribution, scaled, negated and shifted (fresh seeds); the last
    # one after perturbing every parameter of both models identically (by name), so affine weights and
    # biases other than GroupNorm's 1 and 0 are exercised.
    variants = (("own", lambda t: t), ("x3", lambda t: t * 3), ("neg", lambda t: -t),
                ("shift", lambda t: t - 0.5), ("params", lambda t: t))
    worst_l2, worst_max, worst_elem = 0.0, 0.0, 0.0
    per_variant = {}
    with torch.no_grad():
        for k, (label, f) in enumerate(variants):
            if label == "params":
                cand_params = dict(cand.named_parameters())
                for i, (name, p) in enumerate(ref.named_parameters()):
                    noise = torch.randn(p.shape, generator=torch.Generator().manual_seed(99 + i))
                    p.add_(0.1 * noise.to(p.device))
                    if name in cand_params:
                        cand_params[name].copy_(p)
            torch.manual_seed(1000 + 17 * k)
            xs = [f(t).cuda() if torch.is_tensor(t) else t for t in ref_ns["get_inputs"]()]
            expected = ref(*[t.clone() if torch.is_tensor(t) else t for t in xs])
            got = cand(*[t.clone() if torch.is_tensor(t) else t for t in xs])
            torch.cuda.synchronize()
            if got.shape != expected.shape or got.dtype != expected.dtype:
                return {"status": "incorrect", "load_s": load_s,
                        "message": f"shape/dtype {tuple(got.shape)} {got.dtype} vs {tuple(expected.shape)} {expected.dtype}"}
            diff = (got.double() - expected.double())
            l2 = (diff.norm() / expected.double().norm().clamp_min(1e-30)).item()
            mx = diff.abs().max().item()
            rms = expected.double().pow(2).mean().sqrt().item()
            elem = (diff.abs() / (task.rtol * expected.double().abs() + task.atol * rms)).max().item()
            if not torch.isfinite(got).all():
                l2 = float("inf")
            per_variant[label] = l2
            worst_l2, worst_max, worst_elem = max(worst_l2, l2), max(worst_max, mx), max(worst_elem, elem)
            del expected, got, diff, xs

        correct = worst_l2 <= task.l2_tol and worst_elem <= 1.0
        result = {"status": "ok" if correct else "incorrect", "load_s": load_s, "rel_l2": worst_l2,
                  "max_abs": worst_max, "elem_ratio": worst_elem, "per_variant": per_variant}
        if not correct:
            return result

        props = torch.cuda.get_device_properties(0)
        l2_bytes = getattr(props, "L2_cache_size", 0) or 50 * 2**20
        flush_buf = torch.empty(max(2 * l2_bytes, 256 * 2**20) // 4, dtype=torch.float32, device="cuda")
        input_sets = []
        for s in range(2):
            torch.manual_seed(7 + s)
            input_sets.append([t.cuda() if torch.is_tensor(t) else t for t in ref_ns["get_inputs"]()])
        ref_ms = _time_ms(ref, input_sets, trials, lambda: _flush_l2(flush_buf))
        cand_ms = _time_ms(cand, input_sets, trials, lambda: _flush_l2(flush_buf))
    med_ref, med_cand = statistics.median(ref_ms), statistics.median(cand_ms)
    result.update({"ref_ms": med_ref, "cand_ms": med_cand, "speedup": med_ref / med_cand,
                   "cand_spread": (max(cand_ms) - min(cand_ms)) / med_cand})
    return result


# ------------------------------------------------------------------------------------------ driver

def _run_worker(args: list[str], env: dict, timeout: float) -> dict:
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), *args], env=env, timeout=timeout,
                              capture_output=True, text=True, start_new_session=True)
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "wall_s": time.perf_counter() - t0}
    wall = time.perf_counter() - t0
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("RESULT "):
            out = json.loads(line[len("RESULT "):])
            out["wall_s"] = wall
            return out
    err = (proc.stderr or proc.stdout).strip().splitlines()
    interesting = [l for l in err if "Error" in l or "error" in l] or err
    return {"status": "runtime_error", "wall_s": wall, "rc": proc.returncode,
            "message": " | ".join(interesting[-3:])[:400]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", help="candidate stems to run (default: all)")
    ap.add_argument("--trials", type=int, default=30)
    ap.add_argument("--build-timeout", type=float, default=300)
    ap.add_argument("--check-timeout", type=float, default=120)
    ap.add_argument("--worker", choices=["build", "check"], help=argparse.SUPPRESS)
    ap.add_argument("--file", help=argparse.SUPPRESS)
    ap.add_argument("--task", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.worker:
        fn = (lambda: worker_build(args.file)) if args.worker == "build" else \
             (lambda: worker_check(args.file, args.task, args.trials))
        try:
            res = fn()
        except Exception as e:  # report, the driver decides
            res = {"status": "compile_error" if args.worker == "build" else "runtime_error",
                   "message": f"{type(e).__name__}: {str(e)[-600:]}"}
        print("RESULT " + json.dumps(res), flush=True)
        return 0

    import torch
    cands = [c for c in CANDIDATES if not args.only or c.stem in args.only]
    root = tempfile.mkdtemp(prefix="pacevolve_check_")
    envs = {}
    for c in cands:
        env = dict(os.environ)
        env["TORCH_EXTENSIONS_DIR"] = os.path.join(root, c.stem)
        env.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
        envs[c.stem] = env
    print(f"GPU: {torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none'}; torch "
          f"{torch.__version__}; CUDA {torch.version.cuda}; TORCH_CUDA_ARCH_LIST="
          f"{os.environ.get('TORCH_CUDA_ARCH_LIST', '9.0 (set here)')}", flush=True)

    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(len(cands)) as pool:
        builds = dict(zip([c.stem for c in cands], pool.map(
            lambda c: _run_worker(["--worker", "build", "--file", os.path.join(KERNELS, c.stem + ".py")],
                                  envs[c.stem], args.build_timeout), cands)))
    print(f"built {len(cands)} candidates concurrently in {time.perf_counter() - t0:.1f} s", flush=True)

    rows = []
    for c in cands:
        b = builds[c.stem]
        if b.get("status") not in (None, "ok") and "build_s" not in b:
            res = b
        else:
            res = _run_worker(["--worker", "check", "--file", os.path.join(KERNELS, c.stem + ".py"),
                               "--task", c.task, "--trials", str(args.trials)], envs[c.stem], args.check_timeout)
        res["build_s"] = b.get("build_s")
        rows.append((c, res))
        print(f"  {c.stem}: {json.dumps(res)}", flush=True)

    head = f"| candidate | task | expected | status | build s | rel L2 | max abs | ref ms | cand ms | speedup |"
    print("\n" + head + "\n|" + "---|" * 10)
    fmt = lambda v, f: (f % v) if isinstance(v, (int, float)) else "-"
    for c, r in rows:
        print(f"| {c.stem} | {c.task} | {c.expected} | {r.get('status')} | {fmt(r.get('build_s'), '%.1f')} | "
              f"{fmt(r.get('rel_l2'), '%.1e')} | {fmt(r.get('max_abs'), '%.1e')} | {fmt(r.get('ref_ms'), '%.3f')} | "
              f"{fmt(r.get('cand_ms'), '%.3f')} | {fmt(r.get('speedup'), '%.2fx')} |")
    for c, r in rows:
        if r.get("message"):
            print(f"{c.stem}: {r['message'][:300]}")
    mismatches = [c.stem for c, r in rows if r.get("status") != c.expected]
    print("all as expected" if not mismatches else f"NOT as expected: {', '.join(mismatches)}")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())

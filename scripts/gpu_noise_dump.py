"""Every batch's steps of a few evaluations on a GPU, written to OUTDIR/noise.json and summarised (each
step's median and 10-90% range per side, the speedup and its interval): where an interval comes from
(BENCHMARKS.md, sessions 11-12). Default: softmax@v0's honest twin (~10 us a call), four evaluations,
about a minute; --task conv_groupnorm --candidate tests/kernels/conv_groupnorm_fused.py for a large call.

    python3 scripts/gpu_noise_dump.py OUTDIR [--task NAME] [--candidate FILE] [--evals N]
"""
import argparse
import json
import os
import re
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import evaluate_kernel as ek  # noqa: E402
import tasks  # noqa: E402

STEPS = ("draw", "calls", "settle", "digest", "probe")


def summary(timing: dict) -> list[str]:
    lines = []
    for side in ("ref", "cand"):
        rows = timing.get(f"batches_{side}_ms") or []
        if not rows:
            continue
        parts = []
        for step in STEPS:
            xs = sorted(r[step] for r in rows)
            q = lambda f: xs[min(len(xs) - 1, int(f * len(xs)))]
            parts.append(f"{step} {statistics.median(xs):.1f} [{q(0.1):.1f}, {q(0.9):.1f}]")
        lines.append(f"   {side}: {len(rows)} batches of {rows[-1]['n']} calls, ms: " + "; ".join(parts))
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description="Every batch's steps of a few evaluations on a GPU, to "
                                 "OUTDIR/noise.json, each step's median and 10-90%% range printed (needs a GPU).")
    ap.add_argument("outdir")
    ap.add_argument("--task", default="softmax@v0", help="a built-in task (default softmax@v0)")
    ap.add_argument("--candidate", help="a candidate file (default: the reference's own code as ModelNew, "
                                        "its honest twin)")
    ap.add_argument("--evals", type=int, default=4, help="evaluations of the candidate (default 4)")
    args = ap.parse_args()
    import torch
    if not torch.cuda.is_available():
        print("gpu_noise_dump.py needs a CUDA GPU", file=sys.stderr)
        sys.exit(2)
    task = tasks.get(args.task)
    if args.candidate:
        with open(args.candidate) as f:
            src = f.read()
    else:
        src = re.sub(r"\bModel\b", "ModelNew", task.reference_src)
    dump = []
    os.makedirs(args.outdir, exist_ok=True)
    with ek.Evaluator.for_task(task, gpus=[0], cache_dir="/tmp/noise_dump") as ev:
        print("baseline", ev.baseline_info(0), flush=True)
        for k in range(args.evals):
            t0 = time.time()
            r = ev.evaluate(src)
            t = r.details.get("timing") or {}
            print(k, r.status, r.message, f"{time.time() - t0:.1f} s", flush=True)
            print("\n".join(summary(t)), flush=True)
            dump.append({"message": r.message, "timing": t, "phases": r.details.get("phases"),
                         "probe_idle_ms": r.details.get("probe_idle_ms")})
    with open(os.path.join(args.outdir, "noise.json"), "w") as f:
        json.dump(dump, f)


if __name__ == "__main__":
    main()

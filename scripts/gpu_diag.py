"""The parent's clock on a GPU, step by step (BENCHMARKS.md, session 10): for softmax@v0 and
conv_groupnorm, the reference's own code as a candidate (a true speedup of 1) evaluated three times, with
each side's median per step (draw, calls, settle, digest, probe), then the same protocol timed
independently (scripts/bench_agreement.py's timer); then, beside their honest twins, two GPU cheats of
tests/cheats (work left on a side stream after "done", work left running to slow the reference) and the
small-call one (a 10 us softmax's work moved into the draw). No builds: about 3 minutes on one H100.

    python3 scripts/gpu_diag.py [softmax@v0] [conv_groupnorm] [cheat]
"""
import argparse, os, re, sys, time, statistics as st
STEPS = ("softmax@v0", "conv_groupnorm", "cheat")
ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("steps", nargs="*", metavar="STEP", help=f"any of {', '.join(STEPS)} (default: all)")
which = ap.parse_args().steps or list(STEPS)
if set(which) - set(STEPS):
    ap.error(f"unknown step {sorted(set(which) - set(STEPS))[0]!r}: the steps are {', '.join(STEPS)}")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import torch
import evaluate_kernel as ek, tasks
if not torch.cuda.is_available():
    sys.exit(f"gpu_diag.py: needs a CUDA GPU, and PyTorch sees none (torch {torch.__version__})")

def phases(r):
    t = r.details.get("timing") or {}
    out = {}
    for side in ("batches_ref_ms", "batches_cand_ms"):
        rows = (t.get(side) or [])[1:]
        if rows:
            out[side[8:12]] = {p: round(st.median([x[p] for x in rows]), 3) for p in ("draw", "calls", "digest", "probe")}
            out[side[8:12]]["n"] = rows[0]["n"]
            out[side[8:12]]["calls_min_max"] = (round(min(x["calls"] for x in rows), 3), round(max(x["calls"] for x in rows), 3))
    return out

def line(tag, r):
    print(f"{tag}: {r.status} {r.speedup and round(r.speedup, 4)} ci {[round(v, 4) for v in r.details.get('speedup_ci') or []]} "
          f"cand {r.runtime_ms and round(r.runtime_ms, 5)} ref {r.baseline_ms and round(r.baseline_ms, 5)} pairs "
          f"{(r.details.get('timing') or {}).get('pairs')} time_s {r.details.get('time_s')} {phases(r)} | {r.message[:120]}", flush=True)

import bench_agreement as ba
for name in [w for w in which if w != "cheat"]:
    t0 = time.time()
    task = tasks.get(name)
    twin = re.sub(r"\bModel\b", "ModelNew", task.reference_src)
    with ek.Evaluator.for_task(task, gpus=[0], cache_dir=f"/tmp/diag_{name.replace('@','_')}") as ev:
        print(f"== {name}: start {time.time()-t0:.1f}s baseline {ev.baseline_info()}", flush=True)
        rs = []
        for i in range(3):
            r = ev.evaluate(twin); line(f"{name} twin {i}", r); rs.append(r)
    n = rs[-1].details["timing"]["calls_per_batch"]
    torch.set_num_threads(1)
    ref_ns, m1, m2 = ba.build(task, twin, "cuda", "/tmp/none")
    print(f"{name} independent (n={n}): ref/cand/speedup {ba.alternate(m1, m2, ref_ns, n, 'cuda')}", flush=True)
if "cheat" in which:
    import test_cheats as tc
    from pathlib import Path
    with ek.Evaluator(tc.REFERENCES["gn_cuda"], device="cuda", gpus=[0], cache_dir="/tmp/diag_gn") as ev:
        for i in range(2):
            for f in ("honest/gn_twin.py", "cheats/tail_side_stream_cuda.py") + (("cheats/tail_slows_reference_cuda.py",) if i == 0 else ()):
                r = ev.evaluate((Path(ROOT) / "tests" / f).read_text()); line(f"{f} {i}", r)
    with ek.Evaluator(tc.REFERENCES["softmax"], device="cuda", gpus=[0], cache_dir="/tmp/diag_sm") as ev:
        for i in range(2):
            for f in ("honest/softmax_twin.py", "cheats/batch_work_in_draw_softmax.py"):
                r = ev.evaluate((Path(ROOT) / "tests" / f).read_text()); line(f"{f} {i}", r)

"""Every batch's steps of four evaluations of softmax@v0's honest twin on a GPU (~10 us a call), written to
OUTDIR/noise.json: where a small call's interval comes from (BENCHMARKS.md, session 11). About 1 minute.

    python3 scripts/gpu_noise_dump.py OUTDIR
"""
import argparse, json, os, re, sys, time
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import evaluate_kernel as ek, tasks
ap = argparse.ArgumentParser(description="Every batch's steps of four evaluations of softmax@v0's honest twin on a GPU.")
ap.add_argument("outdir")
out = ap.parse_args().outdir
task = tasks.get("softmax@v0")
twin = re.sub(r"\bModel\b", "ModelNew", task.reference_src)
dump = []
with ek.Evaluator.for_task(task, gpus=[0], cache_dir="/tmp/noise_dump") as ev:
    print("baseline", ev.baseline_info() if hasattr(ev, "baseline_info") else "", flush=True)
    for k in range(4):
        t0 = time.time()
        r = ev.evaluate(twin)
        t = r.details.get("timing") or {}
        print(k, r.status, r.message, "pairs", t.get("pairs"), "n", t.get("calls_per_batch"), f"{time.time()-t0:.1f}s", flush=True)
        dump.append({"message": r.message, "timing": t, "phases": r.details.get("phases"), "probe_idle_ms": r.details.get("probe_idle_ms")})
with open(os.path.join(out, "noise.json"), "w") as f:
    json.dump(dump, f)

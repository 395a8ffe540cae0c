"""GPU smoke run for evaluate_kernel.py (run on the GPU machine; writes a summary to $OUT or ./gpu_smoke.out).

1. Cold build cost of a small load_inline CUDA extension: torch/KernelBench defaults (arch "9.0+PTX", no
   precompiled header, default MAX_JOBS) versus the evaluator's build settings (arch from the GPU, no PTX,
   MAX_JOBS=2, precompiled torch/extension.h), each in a fresh process and directory, with per-file times
   from ninja's log.
2. The GPU-marked tests of tests/test_evaluate.py.
   (test_gpu_repeatability evaluates the same cached candidate 5 times: spread of medians, wall per call.)
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
OUT = os.environ.get("OUT") or os.path.join(ROOT, "gpu_smoke.out")
os.makedirs(OUT, exist_ok=True)

KERNEL = r'''
import os, time, json, sys
sys.path.insert(0, {root!r})
from torch.utils import cpp_extension as ce
if {ours}:
    from evaluate_kernel import build as eval_build
    eval_build._install_build_defaults({{"cflags": [], "cuda_cflags": [], "use_pch": True, "pch_lock": "/tmp/pv-pch.lock"}})
cuda_src = """
__global__ void add_one(const float* x, float* y, int n) {{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = x[i] + {tag}.f; }}
torch::Tensor f(torch::Tensor x) {{ auto y = torch::empty_like(x); int n = x.numel();
  add_one<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n); return y; }}
"""
t0 = time.time()
m = ce.load_inline(name="smoke{tag}", cpp_sources="torch::Tensor f(torch::Tensor x);", cuda_sources=cuda_src,
                   functions=["f"], verbose=False)
print(json.dumps({{"build_s": time.time() - t0}}))
'''


def ninja_times(build_root: str) -> dict:
    out = {}
    for dirpath, _, files in os.walk(build_root):
        if ".ninja_log" in files:
            for line in open(os.path.join(dirpath, ".ninja_log")):
                parts = line.split("\t")
                if len(parts) >= 4 and parts[0].isdigit():
                    out[parts[3]] = (int(parts[1]) - int(parts[0])) / 1000
    return out


def cold_build(label: str, ours: bool, env_extra: dict, tag: int) -> dict:
    d = tempfile.mkdtemp(prefix=f"smoke{tag}-")
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=d, CUDA_VISIBLE_DEVICES="", **env_extra)
    if not ours:
        env.pop("MAX_JOBS", None) if "MAX_JOBS" not in env_extra else None
    t0 = time.time()
    p = subprocess.run([sys.executable, "-c", KERNEL.format(root=ROOT, ours=ours, tag=tag)], env=env,
                       capture_output=True, text=True)
    res = {"label": label, "wall_s": round(time.time() - t0, 2), "rc": p.returncode,
           "ninja": ninja_times(d), "tail": (p.stdout + p.stderr)[-800:] if p.returncode else ""}
    print(json.dumps(res), flush=True)
    return res


FULL_REF = open(os.path.join(ROOT, "tests", "candidates_cpu", "reference_small.py")).read().replace(
    "batch_size = 8", "batch_size = 128").replace("in_channels = 3", "in_channels = 8").replace(
    "out_channels = 16", "out_channels = 64").replace("height, width = 32, 32", "height, width = 128, 128").replace(
    "groups = 8", "groups = 16")
HONEST = open(os.path.join(ROOT, "tests", "candidates_cpu", "honest_torch.py")).read()


def independent_ms(ref_src: str, trials: int = 100) -> float:
    """KernelBench-HEAD-style timer in this process: events on the current stream, 256 MiB flush, median."""
    import torch
    ns: dict = {}
    exec(ref_src, ns)
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(42)
    model = ns["Model"](*ns["get_init_inputs"]()).cuda()
    x = [t.cuda() for t in ns["get_inputs"]()]
    flush = torch.empty(64 << 20, dtype=torch.float32, device="cuda")
    times = []
    with torch.no_grad():
        for _ in range(10):
            model(*x)
        for _ in range(trials + 1):
            flush.fill_(1.0)
            torch.cuda.synchronize()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            model(*x)
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b))
    times = sorted(times[1:])
    del model, x, flush
    torch.cuda.empty_cache()
    return times[len(times) // 2]


def full_size(ek) -> dict:
    out: dict = {}
    t0 = time.time()
    with ek.Evaluator(FULL_REF, device="cuda", cache_dir=tempfile.mkdtemp(prefix="fullsize")) as e:
        out["evaluator_start_s"] = round(time.time() - t0, 2)
        t0 = time.time()
        out["baseline_ms"] = e.baseline_ms()
        out["baseline_wall_s"] = round(time.time() - t0, 2)
        out["independent_ms"] = independent_ms(FULL_REF)
        out["agreement"] = out["baseline_ms"] / out["independent_ms"] - 1
        meds, walls, splits = [], [], []
        for _ in range(5):
            t0 = time.time()
            r = e.evaluate(HONEST)
            walls.append(round(time.time() - t0, 2))
            meds.append(r.runtime_ms)
            splits.append({k: r.details.get(k) for k in ("compile_s", "check_s", "time_s")} | {"status": r.status,
                          "spread": r.details.get("timing", {}).get("spread"), "flags": r.details.get("flags")})
        good = [m for m in meds if m]
        out.update(candidate_medians_ms=meds, eval_wall_s=walls, splits=splits,
                   spread_of_medians=(max(good) - min(good)) / min(good) if good else None)
    print(json.dumps(out), flush=True)
    return out


def save(summary: dict) -> None:
    with open(os.path.join(OUT, "gpu_smoke.json"), "w") as f:
        json.dump(summary, f, indent=1, default=str)


def main() -> None:
    start = time.time()
    import torch
    import evaluate_kernel as ek
    cap = torch.cuda.get_device_capability(0)
    arch = ek.arch_list_for(cap)
    summary = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": torch.version.cuda,
               "arch": arch, "cores": os.cpu_count()}
    print(json.dumps(summary), flush=True)
    builds = [cold_build("before: 9.0+PTX, no pch", False, {"TORCH_CUDA_ARCH_LIST": "9.0+PTX"}, 1),
              cold_build("after: ours (first: builds pch)", True, {"TORCH_CUDA_ARCH_LIST": arch, "MAX_JOBS": "2"}, 2),
              cold_build("after: ours (pch warm)", True, {"TORCH_CUDA_ARCH_LIST": arch, "MAX_JOBS": "2"}, 3),
              ]
    if time.time() - start < 170:
        builds.append(cold_build("arch from GPU, MAX_JOBS=2, no pch", False,
                                 {"TORCH_CUDA_ARCH_LIST": arch, "MAX_JOBS": "2"}, 4))
    summary["builds"] = builds
    save(summary)
    summary["full_size"] = full_size(ek)
    save(summary)
    t0 = time.time()
    cmd = [sys.executable, "-m", "pytest", "-q", "-s", "-m", "gpu", "tests/test_evaluate.py", "-p", "no:cacheprovider"]
    try:
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=max(60, 450 - (time.time() - start)))
        rc, text = p.returncode, p.stdout[-6000:] + p.stderr[-2000:]
    except subprocess.TimeoutExpired as e:
        rc, text = "timeout", str(e.stdout or "")[-6000:] + str(e.stderr or "")[-2000:]
    summary["pytest_gpu"] = {"rc": rc, "wall_s": round(time.time() - t0, 1), "tail": text}
    print(text, flush=True)
    save(summary)


if __name__ == "__main__":
    main()

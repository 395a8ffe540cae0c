"""Where a candidate's build time goes, and what light headers and fast_nvcc.py save (BENCHMARKS.md, "Builds").

1. Whole builds through the evaluator: a new source of tests/kernels/conv_groupnorm_fused.py evaluated
   under four option sets: torch's own way (light_headers=False, fast_nvcc=False), each change alone,
   both (the default); the figure is EvalResult.details["build_wall_s"], with ninja's own per-target
   times. Torch's precompiled header for main.cpp is built first, untimed (it is built once per machine).
2. The candidate's cuda.cu alone, with torch's exact nvcc command from build.ninja (its dependency file
   included): nvcc's own phases (`nvcc --time`) with torch's headers and with light_headers.py's,
   then fast_nvcc.py's wall time on the same command.

    python3 scripts/build_cost.py [--no-phases]     # on a GPU machine (the evaluator times on it)
"""
from __future__ import annotations

import argparse
import csv
import glob
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import bench_eval  # noqa: E402
import evaluate_kernel  # noqa: E402
from evaluate_kernel import light_headers  # noqa: E402
import tasks  # noqa: E402

CONFIGS = [("torch's way: real headers, plain nvcc", dict(light_headers=False, fast_nvcc=False)),
           ("light headers, plain nvcc", dict(light_headers=True, fast_nvcc=False)),
           ("real headers, fast_nvcc", dict(light_headers=False, fast_nvcc=True)),
           ("light headers + fast_nvcc (default)", dict(light_headers=True, fast_nvcc=True))]


def whole_builds(src: str, work: str) -> list[tuple[str, str]]:
    from torch.utils import cpp_extension as ce
    t0 = time.perf_counter()
    ce._check_and_build_extension_h_precompiler_headers([], None)  # what the builder does before main.cpp
    rows = [("torch's precompiled header for main.cpp (once per machine, untimed below)",
             f"{time.perf_counter() - t0:.1f} s")]
    task = tasks.get("conv_groupnorm")
    for k, (label, opts) in enumerate(CONFIGS):
        cache = os.path.join(work, f"cache{k}")
        with evaluate_kernel.Evaluator.for_task(task, gpus=[0], cache_dir=cache, **opts) as ev:
            r = ev.evaluate(bench_eval.variant(src, 200 + k))
        d = r.details
        rows.append((f"whole build: {label}", f"{d.get('build_wall_s', float('nan')):.1f} s (status {r.status}, "
                                              f"headers {d.get('build_headers', 'real')}; in the builder "
                                              f"{d.get('compile_s', float('nan')):.1f} s; ninja: "
                                              f"{bench_eval.ninja_steps(os.path.join(cache, 'ext', d['source_hash']))})"))
        print(f"{rows[-1][0]}: {rows[-1][1]}", flush=True)
    return rows


def nvcc_command(ninja_file: str, light_dir: str | None) -> tuple[list[str], str]:
    text = open(ninja_file).read()
    flags = shlex.split(re.search(r"^cuda_cflags = (.*)$", text, re.M).group(1))
    post = re.search(r"^cuda_post_cflags = (.*)$", text, re.M)
    src = os.path.join(os.path.dirname(ninja_file), "cuda.cu")
    extra = [f"-I{light_dir}"] if light_dir else []
    if re.search(r"^\s*command = \$nvcc -MD -MF", text, re.M):  # torch's rule asks for a dependency file
        extra = ["-MD", "-MF", os.path.join(tempfile.mkdtemp(prefix="nvcc_deps_"), "cuda.o.d")] + extra
    return extra + flags + ["-c", src] + (shlex.split(post.group(1)) if post else []), src


def phases(ninja_file: str, light_dir: str | None, nvcc: str) -> list[tuple[str, str]]:
    args, _ = nvcc_command(ninja_file, light_dir)
    out = tempfile.mkdtemp(prefix="nvcc_time_")
    csv_path = os.path.join(out, "time.csv")
    t0 = time.perf_counter()
    subprocess.run([nvcc, *args, "-o", os.path.join(out, "a.o"), "--time", csv_path], check=True, capture_output=True)
    which = "light headers" if light_dir else "real headers"
    rows = [(f"cuda.cu, {which}: nvcc wall", f"{time.perf_counter() - t0:.1f} s")]
    with open(csv_path) as f:
        for row in csv.reader(f):
            if len(row) >= 8 and row[7].strip() == "ms":
                rows.append((f"cuda.cu, {which}: {row[1].strip()}", f"{float(row[6]) / 1e3:.1f} s"))
    t0 = time.perf_counter()
    subprocess.run([sys.executable, os.path.join(ROOT, "evaluate_kernel", "fast_nvcc.py"), "--nvcc", nvcc, *args,
                    "-o", os.path.join(out, "b.o")], check=True, capture_output=True)
    rows.append((f"cuda.cu, {which}: fast_nvcc.py wall", f"{time.perf_counter() - t0:.1f} s"))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--no-phases", action="store_true", help="only the whole builds")
    args = ap.parse_args()
    with open(bench_eval.FUSED) as f:
        src = f.read()
    work = tempfile.mkdtemp(prefix="build_cost_")
    rows = whole_builds(src, work)
    ninja = glob.glob(os.path.join(work, "cache0", "ext", "*", "*", "build.ninja"))
    if ninja and not args.no_phases:
        from torch.utils import cpp_extension as ce
        nvcc = os.path.join(ce.CUDA_HOME, "bin", "nvcc")
        light = os.path.join(work, "light-headers")
        with open(os.path.join(os.path.dirname(ninja[0]), "cuda.cu")) as f:
            print("light headers:", light_headers.write(light, f.read()), flush=True)
        for light_dir in (None, light):
            rows += phases(ninja[0], light_dir, nvcc)
            print("\n".join(f"{k}: {v}" for k, v in rows[-9:]), flush=True)
    print("\n| step | seconds |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

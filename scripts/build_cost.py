"""Where does a load_inline CUDA build spend its time? (issue 7)

Builds one typical candidate (tests/kernels/conv_groupnorm_fused.py) alone, with the flags the evaluator
uses, then re-runs nvcc on the generated cuda.cu with the exact command from torch's build.ninja plus
`--time`, which reports nvcc's own phases: preprocessing, cudafe++ (host front end), cicc (device front
end and optimiser), ptxas, and the final host compile. nvcc runs them one after another: cicc reads the
module id file that cudafe++ writes, so the two front ends cannot overlap.

    python3 scripts/build_cost.py            # on a machine with nvcc and a CUDA build of torch
"""
from __future__ import annotations

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
CANDIDATE = os.path.join(ROOT, "tests", "kernels", "conv_groupnorm_fused.py")


def build(ext_dir: str) -> float:
    """The candidate built in a fresh process, as the evaluator's builder would (no GPU visible)."""
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=ext_dir, MAX_JOBS="2", CUDA_VISIBLE_DEVICES="")
    env.setdefault("TORCH_CUDA_ARCH_LIST", "9.0a")
    code = f"exec(compile(open({CANDIDATE!r}).read(), 'candidate', 'exec'), {{'__name__': 'candidate'}})"
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True)
    return time.perf_counter() - t0


def nvcc_phases(ninja_file: str) -> list[tuple[str, float]]:
    text = open(ninja_file).read()
    nvcc = re.search(r"^nvcc = (.*)$", text, re.M).group(1).strip()
    flags = re.search(r"^cuda_cflags = (.*)$", text, re.M).group(1)
    post = re.search(r"^cuda_post_cflags = (.*)$", text, re.M)
    src = os.path.join(os.path.dirname(ninja_file), "cuda.cu")
    out = tempfile.mkdtemp(prefix="nvcc_time_")
    csv_path = os.path.join(out, "time.csv")
    cmd = [nvcc, *shlex.split(flags), "-c", src, "-o", os.path.join(out, "cuda.o"), "--time", csv_path]
    cmd += shlex.split(post.group(1)) if post else []
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    rows = [("nvcc wall", time.perf_counter() - t0)]
    with open(csv_path) as f:
        for row in csv.reader(f):
            if len(row) >= 8 and row[7].strip() == "ms":
                rows.append((row[1].strip(), float(row[6]) / 1e3))
    return rows


def main() -> int:
    ext_dir = tempfile.mkdtemp(prefix="build_cost_")
    total = build(ext_dir)
    ninja = glob.glob(os.path.join(ext_dir, "*", "build.ninja"))
    print(f"| step | seconds |\n|---|---|\n| whole load_inline build, alone (fresh process) | {total:.1f} |")
    if ninja:
        for name, secs in nvcc_phases(ninja[0]):
            print(f"| cuda.cu: {name} | {secs:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

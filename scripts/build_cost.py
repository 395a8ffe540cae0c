"""Where does a load_inline CUDA build spend its time, and which nvcc flags cut it? (issue 7)

Builds one typical candidate (tests/kernels/conv_groupnorm_fused.py's sources) with several flag sets,
each in its own process and build directory, at the same time, and prints the wall time of each.
Run on a GPU machine: python3 scripts/build_cost.py
"""
import os
import subprocess
import sys
import tempfile
import time

VARIANTS = {
    "default (torch's flags)": [],
    "host -O0 (nvcc -O0: host code only; device code still -O3)": ["-O0"],
    "host -O1": ["-O1"],
}

CHILD = r'''
import os, sys, time, re
src = open(sys.argv[1]).read()
flags = sys.argv[3:]
import torch.utils.cpp_extension as ce
real = ce.load_inline
def patched(*a, **kw):
    kw["extra_cuda_cflags"] = list(kw.get("extra_cuda_cflags") or []) + flags
    kw["build_directory"] = sys.argv[2]
    kw["name"] = kw.get("name", "ext") + "_" + str(abs(hash(tuple(flags))))
    return real(*a, **kw)
ce.load_inline = patched
t0 = time.perf_counter()
exec(compile(src, "candidate", "exec"), {"__name__": "candidate"})
print("BUILD_S", time.perf_counter() - t0)
'''


def main() -> int:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cand = os.path.join(root, "tests", "kernels", "conv_groupnorm_fused.py")
    env = dict(os.environ, TORCH_CUDA_ARCH_LIST="9.0a", MAX_JOBS="2", CUDA_VISIBLE_DEVICES="")
    procs = {}
    for name, flags in VARIANTS.items():
        d = tempfile.mkdtemp(prefix="buildcost_")
        procs[name] = (time.perf_counter(), subprocess.Popen(
            [sys.executable, "-c", CHILD, cand, d, *flags], env=env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True))
    print("| flags | build wall s |\n|---|---|")
    for name, (t0, p) in procs.items():
        out, _ = p.communicate(timeout=600)
        lines = [l for l in out.splitlines() if l.startswith("BUILD_S")]
        took = f"{float(lines[-1].split()[1]):.1f}" if lines else "FAILED: " + out[-300:].replace("\n", " ")
        print(f"| {name} | {took} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

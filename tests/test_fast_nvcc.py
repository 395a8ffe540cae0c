"""fast_nvcc.py: nvcc's steps with the host and device front ends side by side.

Most tests use a fake toolchain: a fake nvcc whose --dryrun lists fake tools that log when they start and end,
sleep, and fail on request, so the scheduling is tested exactly and fast. The last tests use the real nvcc
where it is installed (CUDA's compiler needs no GPU).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from evaluate_kernel import fast_nvcc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "evaluate_kernel", "fast_nvcc.py")

# A tool: logs "<name> start|end <time> <module id>", sleeps FAKE_SLEEP seconds, writes its -o output,
# and exits with FAKE_FAIL_<name> (printing an error) when that is set.
TOOL = textwrap.dedent("""\
    #!{python}
    import os, sys, time
    name = os.path.basename(sys.argv[0]).replace("-", "_").replace("+", "p")
    args = sys.argv[1:]
    ids = [open(args[i + 1]).read() for i, a in enumerate(args) if a == "--module_id_file_name"
           and os.path.exists(args[i + 1])]
    def log(what):
        with open(os.environ["FAKE_LOG"], "a") as f:
            f.write(f"{{name}} {{what}} {{time.time():.3f}} {{ids[0] if ids else '-'}}\\n")
    log("start")
    with open(os.path.join(os.path.dirname(os.environ["FAKE_LOG"]), "commands"), "a") as f:
        f.write(name + " " + " ".join(args) + "\\n")
    time.sleep(float(os.environ.get("FAKE_SLEEP_" + name, os.environ.get("FAKE_SLEEP", "0"))))
    if os.environ.get("FAKE_FAIL_" + name):
        print(f"{{name}}: error: something is wrong", flush=True)
        log("failed")
        sys.exit(int(os.environ["FAKE_FAIL_" + name]))
    if "-o" in args:
        open(args[args.index("-o") + 1], "w").write(name)
    if "-MF" in args:  # the preprocessing's list of what it read: each side one header of its own
        side = "device" if any(a.startswith("-D__CUDA_ARCH__") for a in args) else "host"
        bs, nl = chr(92), chr(10)   # a line continued, and a space inside a name, as gcc writes them
        open(args[args.index("-MF") + 1], "w").write(
            f"{{args[args.index('-MT') + 1]}}: x.cu /x/both.h {{bs}}{{nl}} /x/{{side}}{{bs}} only.h{{nl}}")
    log("end")
""")

# The fake nvcc: --dryrun prints nvcc's step list for one .cu file (same shape as CUDA 13.0's); a normal
# call logs its arguments (the pass-through path) and writes the output.
NVCC = textwrap.dedent("""\
    #!{python}
    import os, sys, time
    args = sys.argv[1:]
    out = args[args.index("-o") + 1] if "-o" in args else "a.o"
    tmp, b = os.environ.get("TMPDIR", "/tmp"), "{bin}"
    if "--dryrun" in args:
        lines = ["_SPACE_= ", "FAKE_BIN=" + b, 'INCLUDES="-I/x/include"  ', 'LIBRARIES=  "-L/x" "-L/y"',
                 f'"$FAKE_BIN/gcc" -E -x c++ -D__CUDACC__ x.cu -o "{{tmp}}/x.cpp4.ii"',
                 f'"$FAKE_BIN/cudafe++" --gen_c_file_name "{{tmp}}/x.cudafe1.cpp" --gen_module_id_file '
                 f'--module_id_file_name "{{tmp}}/x.module_id" "{{tmp}}/x.cpp4.ii"',
                 f'"$FAKE_BIN/gcc" {{"--preprocess" if os.environ.get("FAKE_NO_DEVICE_E") else "-E"}} -x c++ '
                 f'-D__CUDA_ARCH__=900 x.cu -o "{{tmp}}/x.cpp1.ii"',
                 f'"$FAKE_BIN/cicc" --module_id_file_name "{{tmp}}/x.module_id" "{{tmp}}/x.cpp1.ii" -o "{{tmp}}/x.ptx"',
                 f'"$FAKE_BIN/ptxas" -arch=sm_90a "{{tmp}}/x.ptx" -o "{{tmp}}/x.cubin"',
                 f'"$FAKE_BIN/fatbinary" -64 "--image3=kind=elf,sm=90a,file={{tmp}}/x.cubin"',
                 f'rm "{{tmp}}/x.fatbin"',
                 f'"$FAKE_BIN/gcc" -c -x c++ "{{tmp}}/x.cudafe1.cpp" -o "{{out}}"']
        if os.environ.get("FAKE_RDC"):
            lines.insert(-1, '"$FAKE_BIN/nvlink" --arch=sm_90a x.o')
        sys.stderr.write("".join("#$ " + l + "\\n" for l in lines))
        sys.exit(0)
    with open(os.environ["FAKE_LOG"], "a") as f:
        f.write(f"nvcc_run start {{time.time():.3f}} -\\n")
    time.sleep(float(os.environ.get("FAKE_SLEEP_nvcc", "0")))
    with open(os.environ["FAKE_LOG"], "a") as f:
        f.write(f"nvcc_run end {{time.time():.3f}} -\\n")
        f.write("nvcc " + " ".join(args) + "\\n")
    open(out, "w").write("nvcc")
""")


@pytest.fixture
def fake(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("gcc", "cudafe++", "cicc", "ptxas", "fatbinary", "nvlink"):
        path = bin_dir / name
        path.write_text(TOOL.format(python=sys.executable))
        path.chmod(0o755)
    nvcc = tmp_path / "nvcc"
    nvcc.write_text(NVCC.format(python=sys.executable, bin=bin_dir))
    nvcc.chmod(0o755)
    log = tmp_path / "log"
    log.write_text("")
    monkeypatch.setenv("FAKE_LOG", str(log))

    def run(*args: str, **env: str) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
        proc = subprocess.run([sys.executable, SCRIPT, "--nvcc", str(nvcc), *args], capture_output=True, text=True,
                              cwd=tmp_path, env=dict(os.environ, **env), timeout=60)
        return proc, [line.split() for line in log.read_text().splitlines()]
    return run


def events(log: list[list[str]], tool: str) -> dict[str, float]:
    return {e[1]: float(e[2]) for e in log if e[0] == tool}


def test_front_ends_run_side_by_side_and_share_one_module_id(fake, tmp_path):
    proc, log = fake("-c", "x.cu", "-o", "x.o", FAKE_SLEEP_cudafepp="1.5", FAKE_SLEEP_cicc="1.5")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    host, device = events(log, "cudafepp"), events(log, "cicc")
    assert device["start"] < host["end"] and host["start"] < device["end"]  # they overlapped
    ids = {e[3] for e in log if e[0] in ("cudafepp", "cicc")}
    assert len(ids) == 1 and ids != {"-"}  # both read the module id written before either started
    finals = [e for e in log if e[0] == "gcc"]
    assert float(finals[-1][2]) >= max(host["end"], events(log, "fatbinary")["end"])  # the final step waits for both
    assert (tmp_path / "x.o").read_text() == "gcc"
    assert not any(e[0] == "nvcc" for e in log)  # nvcc itself only listed the steps


def test_host_failure_stops_the_device_chain_and_shows_host_errors(fake):
    proc, log = fake("-c", "x.cu", "-o", "x.o", FAKE_FAIL_cudafepp="2", FAKE_SLEEP_cudafepp="0.5", FAKE_SLEEP_cicc="5")
    assert proc.returncode == 2
    assert "cudafepp: error" in proc.stdout and "cicc" not in proc.stdout + proc.stderr
    assert "end" not in events(log, "cicc")  # killed, not waited for
    assert not [e for e in log if e[0] == "gcc" and "start" in e and float(e[2]) > events(log, "cudafepp")["failed"]]


def test_device_only_failure_shows_device_errors(fake):
    proc, log = fake("-c", "x.cu", "-o", "x.o", FAKE_FAIL_ptxas="3")
    assert proc.returncode == 3
    assert "ptxas: error" in proc.stdout
    assert "fatbinary" not in {e[0] for e in log}


def test_unrecognised_pipelines_and_flags_go_to_nvcc_unchanged(fake):
    proc, log = fake("-c", "x.cu", "-o", "x.o", FAKE_RDC="1")  # device linking: not the usual shape
    assert proc.returncode == 0 and log[-1][:2] == ["nvcc", "-c"]
    for extra in (["-M"], ["--threads", "4"], ["-rdc=true"], ["-E"]):
        proc, log = fake("-c", "x.cu", "-o", "x.o", *extra)
        assert proc.returncode == 0 and log[-1] == ["nvcc", "-c", "x.cu", "-o", "x.o", *extra]
    proc, log = fake("-c", "a.cu", "b.cu")  # two sources
    assert log[-1] == ["nvcc", "-c", "a.cu", "b.cu"]


def test_dependency_file_is_listed_by_the_preprocessing_itself(fake, tmp_path):
    # torch's build.ninja always asks nvcc for a dependency file; that must not send the build to plain nvcc,
    # nor cost a third preprocessing: the two the compile runs list what they read, merged as nvcc does.
    for mode, flag in (("-MD", "-MD"), ("-MMD", "-MMD")):
        proc, log = fake(mode, "-MF", "x.o.d", "-O3", "-c", "x.cu", "-o", "x.o")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "nvcc_run" not in {e[0] for e in log}
        assert (tmp_path / "x.o").read_text() == "gcc"
        assert (tmp_path / "x.o.d").read_text() == (
            "x.o : x.cu \\\n    /x/both.h \\\n    /x/device\\ only.h \\\n    /x/host\\ only.h\n")
        preprocessing = [c for c in (tmp_path / "commands").read_text().splitlines() if " -E " in c]
        assert len(preprocessing) == 2 and all(f" {flag} -MF " in c for c in preprocessing)
        (tmp_path / "x.o.d").unlink()
        (tmp_path / "commands").unlink()


def test_dependency_file_of_another_shape_comes_from_nvcc_beside_the_compile(fake, tmp_path):
    proc, log = fake("-MD", "-MF", "x.o.d", "-O3", "-c", "x.cu", "-o", "x.o", FAKE_NO_DEVICE_E="1",
                     FAKE_SLEEP_cudafepp="1.5", FAKE_SLEEP_cicc="1.5", FAKE_SLEEP_nvcc="1.5")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert ["nvcc", "-M", "-MT", "x.o", "-O3", "x.cu", "-o", "x.o.d"] in log
    deps, host = events(log, "nvcc_run"), events(log, "cudafepp")
    assert deps["start"] < host["end"] and host["start"] < deps["end"]  # beside the front ends
    assert (tmp_path / "x.o").read_text() == "gcc" and (tmp_path / "x.o.d").read_text() == "nvcc"


def test_no_dependency_file_after_a_failure(fake, tmp_path):
    proc, log = fake("-MD", "-MF", "x.o.d", "-c", "x.cu", "-o", "x.o", FAKE_FAIL_cudafepp="2")
    assert proc.returncode == 2 and "cudafepp: error" in proc.stdout
    assert not (tmp_path / "x.o.d").exists()
    proc, log = fake("-MD", "-MF", "x.o.d", "-c", "x.cu", "-o", "x.o", FAKE_NO_DEVICE_E="1",
                     FAKE_FAIL_cudafepp="2", FAKE_SLEEP_nvcc="5")
    assert proc.returncode == 2 and "end" not in events(log, "nvcc_run")


@pytest.mark.parametrize("args, compile_args, deps", [
    (["-MD", "-MF", "o.d", "-c", "x.cu", "-o", "o"], ["-c", "x.cu", "-o", "o"], ["-M", "-MT", "o", "x.cu", "-o", "o.d"]),
    (["--generate-nonsystem-dependencies-with-compile", "--dependency-output", "o.d", "-I", "inc", "-c", "x.cu",
      "-o", "o", "-MT", "t"], ["-I", "inc", "-c", "x.cu", "-o", "o"], ["-MM", "-MT", "t", "-I", "inc", "x.cu", "-o", "o.d"]),
    (["-c", "x.cu", "-o", "o"], ["-c", "x.cu", "-o", "o"], None),  # nothing asked
    (["-MD", "-c", "x.cu", "-o", "o"], None, None),  # no -MF: nvcc's own default name, left to nvcc
    (["-MF", "o.d", "-c", "x.cu", "-o", "o"], None, None),  # -MF alone
    (["-MD", "-MF", "o.d", "-c", "x.cu"], None, None),  # no -o
    (["-MD", "-MMD", "-MF", "o.d", "-c", "x.cu", "-o", "o"], None, None),  # two modes at once
])
def test_split_dependencies(args, compile_args, deps):
    got = fast_nvcc.split_dependencies(args)
    assert got == ((compile_args, deps) if compile_args else (args, None))


def test_plan_from_dryrun_splits_steps_and_rejects_other_shapes():
    text = "\n".join("#$ " + l for l in [
        "PATH=/cuda/bin:/usr/bin", 'SYSTEM_INCLUDES="-isystem" "/cuda/include/cccl"',
        'gcc -E x.cu -o "/t/x.cpp4.ii"',
        'cudafe++ --gen_c_file_name "/t/x.cudafe1.cpp" --gen_module_id_file --module_id_file_name "/t/x.module_id" "/t/x.cpp4.ii"',
        'gcc -E -D__CUDA_ARCH__=900 x.cu -o "/t/x.cpp1.ii"',
        '"$CICC_PATH/cicc" --module_id_file_name "/t/x.module_id" "/t/x.cpp1.ii" -o "/t/x.ptx"',
        'ptxas "/t/x.ptx" -o "/t/x.cubin"', 'fatbinary "--image3=kind=elf,sm=90a,file=/t/x.cubin"',
        'rm /t/x.fatbin', 'gcc -c -x c++ "/t/x.cudafe1.cpp" -o "x.o"'])
    plan = fast_nvcc.plan_from_dryrun(text, {})
    assert [fast_nvcc._tool(c) for c in plan.host] == ["gcc", "cudafe++"]
    assert [fast_nvcc._tool(c) for c in plan.device] == ["gcc", "cicc", "ptxas", "fatbinary"]
    assert plan.final == ['gcc -c -x c++ "/t/x.cudafe1.cpp" -o "x.o"']
    assert "--gen_module_id_file" not in plan.host[-1] and plan.module_id_file == "/t/x.module_id"
    assert plan.env["PATH"] == "/cuda/bin:/usr/bin" and "SYSTEM_INCLUDES" not in plan.env
    assert fast_nvcc.plan_from_dryrun(text.replace("--gen_module_id_file ", ""), {}) is None
    assert fast_nvcc.plan_from_dryrun(text.replace("cudafe++", "cudafe"), {}) is None
    assert fast_nvcc.plan_from_dryrun("#$ gcc -c x.cpp -o x.o", {}) is None


NVCC_REAL = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC_REAL is None, reason="needs CUDA's nvcc (no GPU needed)")

KERNEL = textwrap.dedent("""\
    #include <cuda_runtime.h>
    __global__ void scale(float* x, float a, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) x[i] *= a;
    }
    void launch(float* x, float a, int n) { scale<<<(n + 255) / 256, 256>>>(x, a, n); }
""")


def _defined_symbols(obj: str) -> set[str]:
    out = subprocess.run(["nm", "--defined-only", obj], capture_output=True, text=True, check=True).stdout
    # Names inside the anonymous namespace carry the module id, which differs from build to build.
    return {line.split()[-1] for line in out.splitlines() if "_GLOBAL__N_" not in line}


@needs_nvcc
def test_real_nvcc_same_object_symbols(tmp_path):
    (tmp_path / "k.cu").write_text(KERNEL)
    flags = ["-gencode=arch=compute_90a,code=sm_90a", "-O3", "--compiler-options", "-fPIC"]
    subprocess.run([NVCC_REAL, *flags, "-c", "k.cu", "-o", "ref.o"], cwd=tmp_path, check=True)
    proc = subprocess.run([sys.executable, SCRIPT, *flags, "-c", "k.cu", "-o", "fast.o"], cwd=tmp_path,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    fast, ref = _defined_symbols(str(tmp_path / "fast.o")), _defined_symbols(str(tmp_path / "ref.o"))
    assert fast == ref and any("scale" in s for s in fast) and any("launch" in s for s in fast)


@needs_nvcc
def test_real_nvcc_same_dependency_file(tmp_path):
    (tmp_path / "k.cu").write_text(KERNEL)
    flags = ["-gencode=arch=compute_90a,code=sm_90a", "-c", "k.cu", "-o", "out/k.o"]
    (tmp_path / "out").mkdir()
    subprocess.run([NVCC_REAL, "-MD", "-MF", "ref.d", *flags], cwd=tmp_path, check=True)
    proc = subprocess.run([sys.executable, SCRIPT, "-MD", "-MF", "fast.d", *flags], cwd=tmp_path,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ref = (tmp_path / "ref.d").read_text()
    assert ref.startswith("out/k.o : k.cu") and "cuda_runtime.h" in ref
    assert (tmp_path / "fast.d").read_text() == ref


@needs_nvcc
@pytest.mark.parametrize("code, fragment", [
    ("__global__ void k(float* x) { x[0] = 1.0f }", "expected a \";\""),  # host front end (both see it)
    ("int host_only() { return 1; }\n__global__ void k(int* x) { x[0] = host_only(); }",
     "__host__ function"),  # a device-only error: only cicc reports it
])
def test_real_nvcc_errors_read_as_nvcc_s(tmp_path, code, fragment):
    (tmp_path / "bad.cu").write_text(code + "\n")
    flags = ["-gencode=arch=compute_90a,code=sm_90a", "-c", "bad.cu", "-o", "bad.o"]
    ref = subprocess.run([NVCC_REAL, *flags], cwd=tmp_path, capture_output=True, text=True)
    fast = subprocess.run([sys.executable, SCRIPT, *flags], cwd=tmp_path, capture_output=True, text=True)
    assert ref.returncode != 0 and fast.returncode != 0
    assert fragment in ref.stdout + ref.stderr and fragment in fast.stdout + fast.stderr
    assert not (tmp_path / "bad.o").exists()


def test_dependency_lists_merge_whatever_the_target_holds(tmp_path):
    target = "out dir/x: y.o"
    (tmp_path / "device.d").write_text(f"{target}: x.cu /a/b\\ c.h \\\n /a/d$$e.h\n")
    (tmp_path / "host.d").write_text(f"{target}: x.cu /a/f\\#g.h /a/b\\ c.h\n")
    fast_nvcc._write_dependencies(str(tmp_path / "x.d"), target, [str(tmp_path / "device.d"), str(tmp_path / "host.d")])
    assert (tmp_path / "x.d").read_text() == (f"{target} : x.cu \\\n    /a/b\\ c.h \\\n    /a/d$$e.h \\\n"
                                              "    /a/f\\#g.h\n")

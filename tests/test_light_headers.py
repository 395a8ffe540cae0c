"""Tests for light_headers.py: which operators a source keeps, the lean torch/types.h, and real compiles.

The synthetic tests build a tiny fake torch include tree, so each rule is checked on its own; the compile
tests use the installed torch and the host C++ compiler (a .cu file's host code is C++ to it).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evaluate_kernel import light_headers as lh


def fake_torch(root: Path) -> list[str]:
    """Functions.h over ops a..e; ops/a.h uses at::b; ATen/Thing.h (torch's) names c and d unqualified/qualified."""
    inc = root / "include"
    ops = ["a", "b", "c", "d", "e"]
    files = {
        "ATen/Functions.h": "#pragma once\n" + "".join(f"#include <ATen/ops/{o}.h>\n" for o in ops)
                            + "namespace at { inline int helper() { return at::e(); } }\n",
        "ATen/NativeFunctions.h": "".join(f"#include <ATen/ops/{o}_native.h>\n" for o in ops),
        "ATen/Thing.h": "#include <ATen/Functions.h>\nnamespace at { void f() { c(); at::d(); } }\n",
        "torch/csrc/api/include/torch/types.h": "#include <ATen/Thing.h>\n#include <torch/csrc/autograd/variable.h>\n"
                                                "#include <torch/library.h>\nnamespace torch { using namespace at; }\n",
        "ATen/ops/a.h": "namespace at { inline int a() { return at::b(); } }\n",
    }
    for o in ops:
        files.setdefault(f"ATen/ops/{o}.h", f"namespace at {{ int {o}(); }}\n")
    for name, text in files.items():
        (inc / name).parent.mkdir(parents=True, exist_ok=True)
        (inc / name).write_text(text)
    return [str(inc), str(inc / "torch" / "csrc" / "api" / "include")]


def kept(out: Path, header: str = "ATen/Functions.h", suffix: str = "") -> set[str]:
    import re
    return set(re.findall(r"#include <ATen/ops/(\w+)%s\.h>" % suffix, (out / header).read_text()))


def test_keeps_the_operators_the_source_and_their_headers_name(tmp_path):
    dirs = fake_torch(tmp_path)
    info = lh.write(str(tmp_path / "out"), "#include <torch/types.h>\nint g() { return a(); }\n", torch_dirs=dirs)
    # a: named by the source; b: by a's header; d: qualified in a torch header; e: by Functions.h's own code.
    # c is called unqualified inside torch's header and is not kept: torch's headers are read by qualified
    # names only (a miss would fail to compile, and the real headers would then be used).
    assert kept(tmp_path / "out") == {"a", "b", "d", "e"}
    assert kept(tmp_path / "out", "ATen/NativeFunctions.h", "_native") == {"a", "b", "d", "e"}
    assert info == {"lean_types": True, "operators": 4, "of": 5, "thrust": "kept"}  # fake torch names no thrust


def test_the_candidate_s_own_headers_count_every_name(tmp_path):
    dirs = fake_torch(tmp_path)
    own = tmp_path / "own"
    own.mkdir()
    (own / "mine.h").write_text("int h() { return c(); }\n")
    lh.write(str(tmp_path / "out"), '#include <mine.h>\n', [str(own)], torch_dirs=dirs)
    assert "c" in kept(tmp_path / "out")


def test_lean_types_drops_autograd_and_the_library_only(tmp_path):
    dirs = fake_torch(tmp_path)
    lh.write(str(tmp_path / "out"), "int x;\n", torch_dirs=dirs)
    types_h = (tmp_path / "out" / "torch" / "types.h").read_text()
    assert "autograd" not in types_h and "library" not in types_h
    assert "#include <ATen/Thing.h>" in types_h and "using namespace at;" in types_h
    for name in ("extension.h", "torch.h"):
        assert (tmp_path / "out" / "torch" / name).read_text() == lh.LIGHT_EXTENSION_H


@pytest.mark.parametrize("source, keeps", [
    ("auto w = torch::zeros({3}, opts.requires_grad(true));", True),
    ("auto t = torch::tensor({1.0, 2.0});", True),  # torch::tensor's dtype is the default dtype, at::'s is double
    ("auto t = tensor ({1, 2});", True),
    ("torch::autograd::Variable v;", True),
    ("TORCH_LIBRARY(my_ops, m) {}", True),
    ("auto y = torch::empty_like(x); int n = tensor_count(y); const at::Tensor& tensor = y;", False),
])
def test_sources_that_need_torch_s_own_factories_keep_them(tmp_path, source, keeps):
    assert lh.needs_torch_types(source) is keeps
    dirs = fake_torch(tmp_path)
    info = lh.write(str(tmp_path / "out"), source, torch_dirs=dirs)
    assert info["lean_types"] is (not keeps)
    assert (tmp_path / "out" / "torch" / "types.h").exists() is (not keeps)


IDENT = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True)


@given(st.sampled_from(["at", "torch"]), st.lists(IDENT, min_size=1, max_size=4), st.sampled_from(["::", " :: "]))
def test_qualified_names_are_every_part_of_the_chain_except_ops_calls(root, parts, sep):
    text = f"x = {root}{sep}{sep.join(parts)}(y);"
    assert lh.qualified_names(text) == (set() if parts[0] == "_ops" else set(parts))
    assert lh.qualified_names(f"cat::{parts[0]}(y); what::{parts[0]}") == set()


def test_only_operators_keeps_exactly_the_named_includes():
    text = "#pragma once\n#include <ATen/ops/a.h>\n#include <ATen/ops/b.h>\n#include <ATen/Context.h>\nint z;\n"
    out = lh.only_operators(text, {"b"})
    assert "<ATen/ops/b.h>" in out and "<ATen/ops/a.h>" not in out and "<ATen/Context.h>" in out
    assert out.endswith("int z;\n")


def test_thrust_is_declared_only_when_the_source_never_names_complex_numbers(tmp_path):
    dirs = fake_torch(tmp_path)
    (Path(dirs[0]) / "c10/util/complex.h").parent.mkdir(parents=True)
    (Path(dirs[0]) / "c10/util/complex.h").write_text(
        "#include <thrust/complex.h>\ntemplate <class T> T abs(c<T> z) { return thrust::abs(thrust::complex<T>(z)); }\n"
        "template <class T> T e(c<T> z) { return thrust :: exp (z); }\n")
    (Path(dirs[0]) / "ATen/Thing.h").write_text("#include <c10/util/complex.h>\n")
    info = lh.write(str(tmp_path / "out"), "#include <torch/types.h>\nint g();\n", torch_dirs=dirs)
    stub = (tmp_path / "out" / "thrust" / "complex.h").read_text()
    assert info["thrust"] == "declared"
    assert "template <typename... T> struct complex;" in stub
    assert "template <typename... A> void abs(A&&...) = delete;" in stub and " exp(A&&...) = delete;" in stub
    assert "{" not in stub.split("namespace thrust {")[1]  # nothing defined
    for source, extra in (("// a Complex number\n", None), ("#include <thrust/sort.h>\n", None),
                          ("#include <torch/types.h>\n", [str(tmp_path)])):
        out = tmp_path / f"kept{len(source)}"
        info = lh.write(str(out), source, extra, torch_dirs=dirs)
        assert info["thrust"] == "kept" and not (out / "thrust").exists()
    # a torch header beyond the complex type that uses thrust (its own pair): thrust stays
    (Path(dirs[0]) / "ATen/native").mkdir(parents=True)
    (Path(dirs[0]) / "ATen/native/SharedReduceOps.h").write_text(
        "#include <thrust/pair.h>\ntemplate <class A, class B> using pair = thrust::pair<A, B>;\n")
    source = "#include <torch/types.h>\n#include <ATen/native/SharedReduceOps.h>\n"
    assert lh.write(str(tmp_path / "native"), source, None, torch_dirs=dirs)["thrust"] == "kept"
    assert lh.write(str(tmp_path / "plain"), "#include <torch/types.h>\n", None, torch_dirs=dirs)["thrust"] == "declared"


@pytest.mark.parametrize("source, flags, hides", [
    ("__global__ void k(float* x) { x[0] = 1; }", [], False),
    ("__global__ void k(float* x) { x[0] = 1; }", ["-O3", "--use_fast_math"], False),
    ("__global__ void k(float* x) { x[0] = 1; }", [""], False),
    ("#define OP(a, b) a##b\n", [], True),                        # a name pasted: the text does not hold it
    ("__global__ void k(float* x) { x[0] = 1; }", ["-DNAME=relu"], True),
    ("__global__ void k(float* x) { x[0] = 1; }", ["-UNDEBUG"], True),
    ("__global__ void k(float* x) { x[0] = 1; }", ["-include", "x.h"], True),
    ("#define OP(a, b) a %:%: b\n", [], True),                     # the same paste, as a digraph
    ("??=define OP(a, b) a ??=??= b\n", [], True),                 # and as trigraphs
    ('#include "helpers.cuh"\n', [], True),                        # a file of the candidate's own
    ("__global__ void k(float* x) { x[0] = 1; }", ["--define-macro=NM=relu"], True),
    ("__global__ void k(float* x) { x[0] = 1; }", ["-Xcompiler=-DNM=relu"], True),
    ("__global__ void k(float* x) { x[0] = 1; }", ["--compiler-options", "-O3,-DNM=relu"], True),
    ("__global__ void k(float* x) { x[0] = 1; }", ["--options-file=f"], True),
    ("__global__ void k(float* x) { x[0] = 1; }", ["@f"], True),
    ("__global__ void k(float* x) { x[0] = 1; }", ["-Iinc"], True),
    ("__global__ void k(float* x) { x[0] = 1; }", ["-O3", "--use_fast_math", "-Xptxas", "-v,-O3", "-lineinfo",
                                                    "-gencode", "arch=compute_90a,code=sm_90a", "-Xcompiler",
                                                    "-fopenmp,-O3", "--expt-relaxed-constexpr",
                                                    "-maxrregcount=64", "-std=c++17"], False),
])
def test_a_source_whose_names_can_hide_from_the_scan_keeps_torch_s_headers(source, flags, hides):
    assert lh.names_can_hide(source, flags, {}) is hides
    assert lh.names_can_hide("int x;", [], {"CPATH": "/tmp/mine"}) is True   # include paths from the environment


# ------------------------------------------------------------------------------ with the installed torch
def compile_flags() -> list[str]:
    from torch.utils import cpp_extension
    if not shutil.which("c++"):
        pytest.skip("needs a C++ compiler")
    return ["-std=c++17"] + [f"-isystem{p}" for p in cpp_extension.include_paths()] + \
        [f"-isystem{sysconfig.get_paths()['include']}"]


HOST_CODE = r"""#include <torch/types.h>
#include <torch/extension.h>
#include <iostream>
torch::Tensor work(torch::Tensor x, torch::Tensor w) {
    TORCH_CHECK(x.dim() == 2, "x must be 2-D");
    auto out = torch::empty({x.size(0), w.size(1)}, x.options());
    auto y = empty_like(x);                                   // found by ADL, as with torch's headers
    auto z = at::softmax(x * 2 + 1, /*dim=*/1).index({at::indexing::Slice(0, 1)});
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "work", [&] { (void)x.data_ptr<scalar_t>(); });
    std::cout << torch::kFloat32 << z.sizes() << std::endl;
    return at::matmul(y, w).add_(out);
}
"""


def test_light_headers_compile_a_kernel_file_s_host_code_without_the_heavy_parts(tmp_path):
    flags = compile_flags()
    info = lh.write(str(tmp_path / "light"), HOST_CODE)
    assert info["lean_types"] and info["operators"] < info["of"] / 10
    (tmp_path / "k.cpp").write_text(HOST_CODE)
    light = ["-I", str(tmp_path / "light")]
    deps = subprocess.run(["c++", *light, *flags, "-M", "k.cpp"], cwd=tmp_path, capture_output=True, text=True,
                          check=True).stdout
    for heavy in ("torch/all.h", "pybind11", "autograd/variable.h", "torch/library.h", "ATen/ops/conv2d.h"):
        assert heavy not in deps
    for needed in ("ATen/ops/softmax.h", "ATen/ops/empty_like.h", "ATen/ops/matmul.h", "ATen/ops/empty.h"):
        assert needed in deps
    r = subprocess.run(["c++", *light, *flags, "-fsyntax-only", "k.cpp"], cwd=tmp_path, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr[-3000:]


OPERATOR_BEHIND_PASTING = "#include <torch/types.h>\n#define CALL(op) at::op##u(x)\n" \
                          "torch::Tensor f(torch::Tensor x) { return CALL(rel); }\n"


def _syntax(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    (tmp_path / "k.cpp").write_text(OPERATOR_BEHIND_PASTING)
    return subprocess.run(["c++", *extra, *compile_flags(), "-fsyntax-only", "k.cpp"], cwd=tmp_path,
                          capture_output=True, text=True)


def test_an_operator_the_scan_cannot_see_fails_to_compile_instead_of_changing_meaning(tmp_path):
    # Token pasting hides `relu` from the scan: the light build must fail, naming it (the real headers then
    # decide).
    lh.write(str(tmp_path / "light"), OPERATOR_BEHIND_PASTING)
    r = _syntax(tmp_path, "-I", str(tmp_path / "light"))
    assert r.returncode != 0 and "relu" in r.stderr, r.stderr[-2000:]


@pytest.mark.slow   # 12 s on the 2-core machine: torch's whole headers parsed
def test_the_pasted_operator_compiles_with_torch_s_headers(tmp_path):
    # The other half of the test above: the failure is the light headers', not the source's.
    r = _syntax(tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]


NVCC = shutil.which("nvcc")


def _kernel_files(tmp_path: Path) -> tuple[list[str], dict[str, Path]]:
    """nvcc's flags for torch's headers, and two kernel files, each in a directory with its light headers: one
    with no complex number ("plain") and one using c10's complex math behind token pasting ("hidden")."""
    flags = ["-std=c++17"] + [f for p in compile_flags()[1:] for f in ("-isystem", p[len("-isystem"):])]
    plain = "#include <torch/types.h>\n__global__ void k(float* x) { x[0] = x[1]; }\n" \
            "torch::Tensor f(torch::Tensor x) { k<<<1, 1>>>(x.data_ptr<float>()); return x; }\n"
    hidden = plain.replace("x[0] = x[1];", "x[0] = std::abs(c10::comp##lex<float>(x[1], x[2]));").replace(
        "__global__", "#define CPLX(a, b) c10::comp##lex<float>(a, b)\n__global__").replace(
        "c10::comp##lex<float>(x[1], x[2])", "CPLX(x[1], x[2])")
    dirs = {}
    for name, source in (("plain", plain), ("hidden", hidden)):
        dirs[name] = tmp_path / name
        dirs[name].mkdir()
        (dirs[name] / "k.cu").write_text(source)
        assert lh.write(str(dirs[name] / "light"), source, [])["thrust"] == "declared"
    return flags, dirs


def _nvcc(flags: list[str], work: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([NVCC, *flags, *args], cwd=work, capture_output=True, text=True)


@pytest.mark.skipif(NVCC is None, reason="needs CUDA's nvcc (no GPU needed)")
def test_a_complex_number_the_scan_cannot_see_fails_to_compile_with_thrust_declared_only(tmp_path):
    # A kernel file with no complex number compiles with thrust's complex type declared only (host and device
    # code: nvcc -c, the whole pipeline); one that uses c10's complex math behind token pasting fails in the
    # host front end, cudafe++, which parses host and device code (nvcc --cuda: the steps before the final host
    # compile), naming the declared type: the real headers then decide. The two compiles run side by side.
    flags, dirs = _kernel_files(tmp_path)
    with ThreadPoolExecutor(2) as pool:
        plain = pool.submit(_nvcc, flags, dirs["plain"], f"-I{dirs['plain'] / 'light'}", "-c", "k.cu", "-o", "k.o")
        hidden = pool.submit(_nvcc, flags, dirs["hidden"], f"-I{dirs['hidden'] / 'light'}", "--cuda", "k.cu",
                             "-o", "k.ii")
        plain, hidden = plain.result(), hidden.result()
    assert plain.returncode == 0, plain.stderr[-3000:]
    assert hidden.returncode != 0 and "thrust::complex<float>" in hidden.stdout + hidden.stderr


@pytest.mark.slow   # 35 s on the 2-core machine: nvcc --cuda over torch's real headers
@pytest.mark.skipif(NVCC is None, reason="needs CUDA's nvcc (no GPU needed)")
def test_the_hidden_complex_number_compiles_with_torch_s_headers(tmp_path):
    # The other half of the test above: the failure is the declarations', not the source's.
    flags, dirs = _kernel_files(tmp_path)
    real = _nvcc(flags, dirs["hidden"], "--cuda", "k.cu", "-o", "k.ii")
    assert real.returncode == 0, real.stderr[-3000:]


# ------------------------------------------------------------------------------ the CUDA candidates in tests/
class _Captured(Exception):
    pass


def cuda_sources_in_tests() -> dict[str, str]:
    """Every .cu file the test candidates hand to load_inline, captured without building anything."""
    import torch.utils.cpp_extension as ce
    from evaluate_kernel import build as eval_build
    found: dict[str, str] = {}
    original = ce.load_inline

    def capture(*args, **kw):
        raise _Captured(kw.get("cuda_sources"))

    root = Path(__file__).parent
    ce.load_inline = capture
    try:
        for path in sorted([*root.glob("kernels/*.py"), *root.glob("honest/*.py"), *root.glob("cheats/*.py")]):
            text = path.read_text()
            if "cuda_sources" not in text:
                continue
            try:
                eval_build._exec_source(text, f"<{path.stem}>")
            except _Captured as c:
                if c.args[0]:
                    found[f"{path.parent.name}/{path.name}"] = eval_build._cu_text(c.args[0])
    finally:
        ce.load_inline = original
    return found


@pytest.mark.gpu
def test_gpu_every_cuda_candidate_in_tests_parses_with_light_headers_as_with_torch_s(tmp_path):
    """Each .cu file: nvcc's host front end (preprocess + cudafe++) with torch's headers, and the whole
    compile (host and device) with light headers (thrust declared only where allowed): none fails."""
    from torch.utils import cpp_extension as ce
    nvcc = os.path.join(ce.CUDA_HOME or "", "bin", "nvcc")
    if not os.path.exists(nvcc):
        pytest.skip("needs nvcc")
    sources = cuda_sources_in_tests()
    assert len(sources) >= 8
    flags = ["-std=c++17"] + [f"-I{p}" for p in ce.include_paths("cuda")] + \
        [f"-I{sysconfig.get_paths()['include']}"]

    thrust: dict[str, str] = {}

    def front_end(name: str, text: str, light: bool) -> subprocess.CompletedProcess:
        work = tmp_path / name.replace("/", "_")
        work.mkdir(exist_ok=True)
        (work / "cuda.cu").write_text(text)
        extra = ["--cuda", "-o", "/dev/null"]
        if light:
            thrust[name] = lh.write(str(work / "light"), text, [])["thrust"]
            extra = [f"-I{work / 'light'}", "-c", "-o", "light.o"]
        return subprocess.run([nvcc, *extra, *flags, "cuda.cu"], cwd=work, capture_output=True, text=True)

    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(8) as pool:
        runs = {(n, light): pool.submit(front_end, n, t, light) for n, t in sources.items() for light in (False, True)}
    for name in sources:
        real, light = runs[(name, False)].result(), runs[(name, True)].result()
        assert real.returncode == 0, (name, real.stderr[-2000:])
        assert light.returncode == 0, (name, light.stderr[-2000:])
    assert list(thrust.values()).count("declared") >= len(sources) // 2, thrust

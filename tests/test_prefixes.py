"""The final step's precompiled prefix: fast_nvcc.py cuts cudafe++'s output and asks for or uses an entry of
prefixes.py's store, which the parent fills through a confined worker. The compiles are real (the host
C++ compiler on a text shaped like cudafe++'s output), so they need g++ only, not nvcc."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from evaluate_kernel import fast_nvcc, prefixes

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
ARGS = ["g++", "-std=c++17", "-c", "-x", "c++", "-O2", "-fPIC"]


def cudafe_output(build: Path, headers: int = 300, code: str = "int candidate() { return S3::f() + 1; }",
                  extra_header: str = "") -> Path:
    """A file shaped like cudafe++'s output: line markers, the headers (some from the build's own
    directory, as light_headers.py's are), then the main file's code from its own line marker on."""
    lines = [f'# 1 "{build}/cuda.cu"', "#pragma GCC diagnostic push", '# 1 "/usr/include/fake.h" 1 3']
    for i in range(headers):
        lines += [f"# {i + 1} \"/usr/include/fake.h\" 3",
                  f"struct S{i} {{ static int f() {{ return {i} * 3 + (int)sizeof(long); }} }};",
                  f"template <typename T> T twice{i}(T x) {{ return x + x + T({i}); }}"]
    lines += [f'# 1 "{build}/pacevolve-headers/torch/types.h" 1', "namespace at { inline int lean() { return 7; } }",
              extra_header, "#pragma GCC diagnostic pop", f'# 5 "{build}/cuda.cu"', code, ""]
    build.mkdir(parents=True, exist_ok=True)
    out = build / "x.cudafe1.cpp"
    out.write_text("\n".join(lines))
    return out


def final_command(source: Path, obj: Path, args=ARGS, light: Path | None = None) -> str:
    include = [f"-I{light}"] if light else []
    return " ".join([*args, *include, f'"{source}"', "-o", f'"{obj}"'])


@pytest.fixture
def small(monkeypatch):
    monkeypatch.setattr(fast_nvcc, "MIN_PREFIX", 1000)
    monkeypatch.setattr(prefixes, "MIN_PREFIX", 1000)


def test_the_cut_is_where_the_main_file_s_code_starts_and_the_build_directory_is_normalised(tmp_path, small):
    a = cudafe_output(tmp_path / "a")
    b = cudafe_output(tmp_path / "elsewhere" / "b", code="int candidate() { return 42; }")
    pa = fast_nvcc.split_prefix(final_command(a, tmp_path / "a.o", light=a.parent / "pacevolve-headers"))
    pb = fast_nvcc.split_prefix(final_command(b, tmp_path / "b.o", light=b.parent / "pacevolve-headers"))
    assert pa.key == pb.key and pa.text == pb.text   # same headers, other directories, other code
    assert pa.rest.startswith(f'# 5 "{tmp_path}/a/cuda.cu"\nint candidate() {{ return S3::f() + 1; }}')
    assert pa.text.startswith('# 1 "@BUILD@/cuda.cu"\n') and str(tmp_path) not in pa.text
    assert '# 1 "@BUILD@/pacevolve-headers/torch/types.h" 1' in pa.text
    assert pa.arguments == ARGS + ["-I@BUILD@/pacevolve-headers"] and pa.source == str(a)
    normal = a.read_text().replace(str(tmp_path / "a"), "@BUILD@")
    assert pa.text + pa.rest.replace(str(tmp_path / "a"), "@BUILD@") == normal
    # anything else in the headers' part, or another argument, is another key
    c = cudafe_output(tmp_path / "c", extra_header="static int other = 1;")
    assert fast_nvcc.split_prefix(final_command(c, tmp_path / "c.o", light=c.parent / "pacevolve-headers")).key != pa.key
    assert fast_nvcc.split_prefix(final_command(a, tmp_path / "a.o", ARGS + ["-O3"],
                                                tmp_path / "a" / "pacevolve-headers")).key != pa.key


def test_no_cut_for_a_small_part_a_module_id_in_it_or_another_shape(tmp_path, small):
    a = cudafe_output(tmp_path / "a", extra_header="namespace _GLOBAL__N__1a2b3c4d_7_cuda_cu { }")
    command = final_command(a, tmp_path / "a.o")
    assert fast_nvcc.split_prefix(command) is not None
    assert fast_nvcc.split_prefix(command, "_1a2b3c4d_7_cuda_cu") is None   # no other compile has that text
    assert fast_nvcc.split_prefix(final_command(cudafe_output(tmp_path / "s", headers=1), tmp_path / "s.o")) is None
    assert fast_nvcc.split_prefix(command.replace("-O2", "-O2 $X")) is None   # the shell would expand it
    assert fast_nvcc.split_prefix(f"g++ -c x.cpp -o x.o") is None


@pytest.mark.parametrize("pragmas, cut", [
    (["#pragma GCC diagnostic push", "#pragma GCC diagnostic ignored \"-Wall\""], True),   # warnings only
    (["#pragma GCC visibility push(default)", "int v();", "#pragma GCC visibility pop"], True),
    (["#pragma GCC visibility push(hidden)"], False),   # GCC 12 drops it at a precompiled header's end
    (["#pragma pack(push, 1)", "struct P { char c; int i; };", "#pragma pack(pop)"], False),
    (["#pragma pack(1)"], False),
    (["  #  pragma weak w"], False),
    (["#pragma GCC optimize (\"O0\")"], False),
    (["#pragma GCC visibility pop", "#pragma GCC visibility push(default)"], False)])
def test_a_part_whose_pragmas_a_precompiled_header_would_lose_is_not_cut(tmp_path, small, pragmas, cut):
    a = cudafe_output(tmp_path / "a", extra_header="\n".join(pragmas))
    assert (fast_nvcc.split_prefix(final_command(a, tmp_path / "a.o")) is not None) == cut


def plan_for(command: str) -> fast_nvcc.Plan:
    return fast_nvcc.Plan(env=dict(os.environ), final=[command])


def precompile(tmp_path: Path, requests: Path, key: str, store: Path) -> str:
    """What the parent does with a request (the worker's compile run here directly)."""
    request = prefixes.read_request(str(requests), key, [], [])
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    (work / prefixes.HEADER).write_text(request["text"])
    command = prefixes.precompile_command(request, str(work / prefixes.HEADER), str(work / prefixes.GCH))
    subprocess.run(command, check=True)
    return prefixes.publish(str(store), request, str(work / prefixes.GCH))


@needs_gxx
def test_a_build_asks_for_its_prefix_and_the_next_compiles_it_from_the_store_to_the_same_object(tmp_path, small):
    store, requests = tmp_path / "store", tmp_path / "requests"
    a = cudafe_output(tmp_path / "a")
    assert fast_nvcc._final(plan_for(final_command(a, tmp_path / "a.o")), str(store), str(requests)) == 0
    (key,) = os.listdir(requests)
    entry = precompile(tmp_path, requests, key, store)
    assert sorted(os.listdir(entry)) == ["READY", "arguments.json", "prefix.h", "prefix.h.gch"]
    # the next candidate: the same headers in another directory, other code
    b = cudafe_output(tmp_path / "b", code="int candidate() { return twice7(20); }")
    whole = subprocess.run(["/bin/sh", "-c", final_command(b, tmp_path / "whole.o")], capture_output=True)
    assert whole.returncode == 0, whole.stderr
    requests_b = tmp_path / "requests_b"
    assert fast_nvcc._final(plan_for(final_command(b, tmp_path / "b.o")), str(store), str(requests_b)) == 0
    assert os.listdir(requests_b) == [f"used-{key}"]
    assert (tmp_path / "b.o").read_bytes() == (tmp_path / "whole.o").read_bytes()


@needs_gxx
def test_a_compile_that_fails_with_the_entry_is_compiled_whole(tmp_path, small, capfd):
    store, requests = tmp_path / "store", tmp_path / "requests"
    a = cudafe_output(tmp_path / "a")
    fast_nvcc._final(plan_for(final_command(a, tmp_path / "a.o")), "", str(requests))
    (key,) = os.listdir(requests)
    entry = Path(precompile(tmp_path, requests, key, store))
    # an entry GCC cannot use and whose text does not compile (no build could have made it): the build
    # still gets the compile of its own text
    os.chmod(entry, 0o755)
    for name in (prefixes.GCH, prefixes.HEADER):
        os.chmod(entry / name, 0o644)
    (entry / prefixes.GCH).write_bytes(b"not a precompiled header")
    (entry / prefixes.HEADER).write_text("#error this entry is broken\n")
    b = cudafe_output(tmp_path / "b")
    requests_b = tmp_path / "requests_b"
    assert fast_nvcc._final(plan_for(final_command(b, tmp_path / "b.o")), str(store), str(requests_b)) == 0
    assert os.listdir(requests_b) == [f"failed-{key}"]
    assert "this entry is broken" not in capfd.readouterr().err
    assert (tmp_path / "b" / "x.cudafe1.cpp").read_text() == cudafe_output(tmp_path / "c").read_text().replace(
        str(tmp_path / "c"), str(tmp_path / "b"))   # the whole text back in its place


def test_a_request_is_checked_before_anything_compiles_it(tmp_path, small):
    requests = tmp_path / "requests"
    a = cudafe_output(tmp_path / "a")
    prefix = fast_nvcc.split_prefix(final_command(a, tmp_path / "a.o"))
    fast_nvcc._request(str(requests), prefix)
    got = prefixes.read_request(str(requests), prefix.key, [], [])
    assert got == {"key": prefix.key, "text": prefix.text, "arguments": prefix.arguments}
    # the text changed after the key was made: its name is no longer its hash
    (requests / prefix.key / "prefix.h").write_text(prefix.text + "int planted;\n")
    with pytest.raises(prefixes.Refused, match="hash"):
        prefixes.read_request(str(requests), prefix.key, [], [])
    # a link in the request's place, a file that is not plain
    os.rename(requests / prefix.key, tmp_path / "moved")
    os.symlink(tmp_path / "moved", requests / prefix.key)
    with pytest.raises(prefixes.Refused, match="link"):
        prefixes.read_request(str(requests), prefix.key, [], [])
    os.unlink(requests / prefix.key)
    fast_nvcc._request(str(requests), prefix)
    os.unlink(requests / prefix.key / "prefix.h")
    os.mkfifo(requests / prefix.key / "prefix.h")
    with pytest.raises(prefixes.Refused):
        prefixes.read_request(str(requests), prefix.key, [], [])
    with pytest.raises(prefixes.Refused, match="not a request"):
        prefixes.read_request(str(requests), "../" + prefix.key[:37], [], [])


TORCH = "/opt/torch/include"


@pytest.mark.parametrize("extra, why", [
    (["-fplugin=/tmp/p.so"], "option"), (["-B/tmp"], "option"), (["-Wl,-rpath,/x"], "option"),
    (["-Wp,-DX"], "option"), (["-include", "/etc/passwd"], "option"), (["@/tmp/options"], "option"),
    (["-wrapper", "gdb"], "option"), (["-specs=/tmp/s"], "option"), (["-imacros", "x.h"], "option"),
    (["-iquote", "/tmp"], "option"), (["-x", "c"], "language"), (["-I/tmp/mine"], "include directory"),
    (["-isystem", "/opt/torch/include/../../tmp"], "include directory"), (["-fdump-tree-all"], "option"),
    (["--param=x=1"], "option"), (["-o", "/tmp/x"], "option"), (["/tmp/other.cpp"], "option")])
def test_a_request_s_arguments_come_from_an_allow_list(extra, why):
    good = ARGS + ["-DTORCH_EXTENSION_NAME=ext", "-D__CUDA_ARCH__=900", "-Wno-psabi", "-m64", "-march=native",
                   "-I@BUILD@/pacevolve-headers", "-isystem", TORCH, f"-I{TORCH}/torch/csrc/api/include"]
    prefixes.check_arguments(good, [TORCH], [])
    with pytest.raises(prefixes.Refused, match=why):
        prefixes.check_arguments(good + extra, [TORCH], [])
    with pytest.raises(prefixes.Refused, match="compiler"):
        prefixes.check_arguments(["/tmp/evil-g++"] + good[1:], [TORCH], [])
    prefixes.check_arguments(["/usr/bin/g++"] + good[1:], [TORCH], ["/usr/bin/g++"])


def test_the_precompile_command_is_the_final_step_s_as_a_header_without_the_build_s_directories():
    request = {"arguments": ARGS + ["-I@BUILD@/pacevolve-headers", "-isystem", "@BUILD@/x", "-isystem", TORCH]}
    assert prefixes.precompile_command(request, "/w/prefix.h", "/w/prefix.h.gch") == \
        ["g++", "-std=c++17", "-O2", "-fPIC", "-isystem", TORCH, "-x", "c++-header", "/w/prefix.h", "-o",
         "/w/prefix.h.gch"]


def test_the_store_keeps_its_most_recently_used_entries_read_only(tmp_path, small, monkeypatch):
    monkeypatch.setattr(prefixes, "MAX_ENTRIES", 2)
    store = tmp_path / "store"
    made = []
    for i in range(4):
        if i == 3:   # a build used the older of the two: the newer goes
            prefixes.touch(str(store), os.path.basename(made[1]))
        text = f"int x{i};\n" * 200
        request = {"key": fast_nvcc.prefix_key(ARGS, text), "text": text, "arguments": ARGS}
        (tmp_path / "g").write_bytes(b"gch")
        made.append(prefixes.publish(str(store), request, str(tmp_path / "g")))
        if i < 3:
            os.utime(os.path.join(made[-1], prefixes.READY), (time.time() - 10 + i, time.time() - 10 + i))
        if i == 2:
            assert prefixes.entries(str(store)) == [os.path.basename(m) for m in made[1:]]
            assert not os.path.exists(made[0])
    assert sorted(prefixes.entries(str(store))) == sorted(os.path.basename(m) for m in (made[1], made[3]))
    assert not os.path.exists(made[2])
    entry = Path(made[3])
    assert (entry / prefixes.HEADER).read_text() == "int x3;\n" * 200
    assert json.loads((entry / "arguments.json").read_text()) == ARGS
    assert {oct(os.stat(entry / n).st_mode & 0o777) for n in os.listdir(entry)} == {"0o444"}
    assert oct(os.stat(entry).st_mode & 0o777) == "0o555"


@needs_gxx
def test_the_evaluator_precompiles_a_builder_s_request_in_a_confined_worker(tmp_path, small, monkeypatch):
    """The parent's side: a request left in a dead builder's home is read, compiled by a worker of ours in
    the namespace, and published; a refused one leaves a note and no entry."""
    import evaluate_kernel as ek
    from evaluate_kernel import namespace as eval_namespace
    problem = eval_namespace.namespace_problem()
    if problem:
        pytest.skip(f"no namespace here: {problem}")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    a = cudafe_output(tmp_path / "a")
    bad = fast_nvcc.split_prefix(final_command(a, tmp_path / "a.o", ARGS + ["-I/tmp/mine"]))
    fast_nvcc._request(str(tmp_path / "home1" / "prefix-requests"), bad)
    # a build that asks for two: one is taken (candidate code could ask for any number)
    good = fast_nvcc.split_prefix(final_command(a, tmp_path / "a.o"))
    other = fast_nvcc.split_prefix(final_command(a, tmp_path / "a.o", ARGS + ["-DOTHER"]))
    for prefix in (good, other):
        fast_nvcc._request(str(tmp_path / "home2" / "prefix-requests"), prefix)
    # a text that keeps the compiler busy (seconds a line) is stopped at the time limit
    burn = (f'# 1 "{fast_nvcc.BUILD}/cuda.cu"\nconstexpr unsigned long burn(unsigned long n, unsigned long s) '
            "{ unsigned long x = s; for (unsigned long i = 0; i < n; ++i) x = x * 6364136223846793005UL + i; "
            "return x; }\n" + "".join(f"constexpr unsigned long v{i} = burn(250000, {i});\n" for i in range(40)))
    fast_nvcc._request(str(tmp_path / "home3" / "prefix-requests"),
                       fast_nvcc.Prefix(fast_nvcc.prefix_key(ARGS, burn), ARGS, burn, "", ""))
    monkeypatch.setattr(prefixes, "TIMEOUT_S", 2)
    ref = (Path(__file__).parent / "candidates_cpu" / "reference_small.py").read_text()
    with ek.Evaluator(ref, device="cpu", cache_dir=str(tmp_path / "cache"), warm_runners=False,
                      eager_baseline=False) as ev:
        details: dict = {}
        store = ev.builds.take_requests(str(tmp_path / "home1" / "prefix-requests"), details)
        assert "include directory '/tmp/mine'" in details["prefix_refused"]
        t0 = time.time()
        for home in ("home3", "home2"):
            ev.builds.take_requests(str(tmp_path / home / "prefix-requests"), details)
        assert ev.builds.prefixes_settled(timeout_s=120)   # both precompiles over: one stored, one stopped
        assert "timed out after 2 seconds" in ev.builds.header_notes["prefix"] and time.time() - t0 < 30
    first = min(good, other, key=lambda p: p.key)   # the requests are taken in their names' order
    assert prefixes.entries(store) == [first.key], ev.builds.header_notes
    b = cudafe_output(tmp_path / "b", code="int candidate() { return S9::f(); }")
    r = subprocess.run(["/bin/sh", "-c", final_command(b, tmp_path / "whole.o", first.arguments)], capture_output=True)
    assert r.returncode == 0
    used = tmp_path / "used"
    assert fast_nvcc._final(plan_for(final_command(b, tmp_path / "b.o", first.arguments)), store, str(used)) == 0
    assert os.listdir(used) == [f"used-{first.key}"]
    assert (tmp_path / "b.o").read_bytes() == (tmp_path / "whole.o").read_bytes()

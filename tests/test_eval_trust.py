"""Tests for the evaluator's trust boundary: checks that cannot skip themselves, the output digest, the
private code copy, the process sweep, and the per-Evaluator log and import directories (CPU, CI)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from evaluate_kernel import common as eval_common
from evaluate_kernel import sandbox as eval_sandbox
import evaluate_kernel as ek

HERE = Path(__file__).parent / "candidates_cpu"
REPO = Path(__file__).resolve().parent.parent
INF, NAN = float("inf"), float("nan")


# ------------------------------------------------------------------------------------------ comparison
def test_infinite_reference_values_do_not_disable_the_tolerance():
    ref = torch.tensor([INF, 1.0, 2.0, 3.0])
    assert eval_common.compare_outputs([ref.clone()], [ref], 1e-4, 1e-4, 1e-5)["ok"]
    zeros = torch.tensor([INF, 0.0, 0.0, 0.0])  # right infinity, nothing else computed
    r = eval_common.compare_outputs([zeros], [ref], 1e-4, 1e-4, 1e-5)
    assert not r["ok"] and "exceeded" in r["reason"]


@pytest.mark.parametrize("got", [[-INF, 1.0, NAN], [INF, 1.0, 0.0], [1.0, 1.0, NAN], [INF, INF, NAN]])
def test_inf_and_nan_must_sit_where_the_reference_has_them(got):
    ref = torch.tensor([INF, 1.0, NAN])
    r = eval_common.compare_outputs([torch.tensor(got)], [ref], 1e-4, 1e-4, 1e-5)
    assert not r["ok"] and "inf/nan" in r["reason"]


def test_all_special_reference_matches_only_itself():
    ref = torch.tensor([INF, -INF, NAN])
    assert eval_common.compare_outputs([ref.clone()], [ref], 1e-4, 1e-4, 1e-5)["ok"]


# ------------------------------------------------------------------------------------------ digest
DIGESTS = {"cpu (BLAKE2b)": eval_common.digests, "gpu (hash tree, run here on the CPU)": eval_common.tree_digests}


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(allow_nan=False, width=32), min_size=1, max_size=300), st.integers(0, 299),
       st.integers(0, 31), st.sampled_from(sorted(DIGESTS)))
def test_digest_binds_every_bit(values, where, bit, kind):
    digest = DIGESTS[kind]
    t = torch.tensor(values, dtype=torch.float32)
    d = digest([[t]])[0]
    assert d == digest([[t.clone()]])[0]
    bits = t.view(torch.int32).clone()
    bits[where % len(values)] ^= 1 << bit if bit < 31 else -(1 << 31)  # one bit of one element
    assert digest([[bits.view(torch.float32)]])[0] != d


@pytest.mark.parametrize("values, flips", [([0.0, 0.0], [1]), ([1.0, -2.0, 3.0, 4.0], [1, 3]),
                                           ([0.5, 0.25, 1.5, -8.0, 2.0, 3.0], [5])])
def test_the_gpu_digest_binds_the_signs_a_pair_of_words_shares(values, flips):
    """Flipping the top bits of both words of a bottom pair (two float32 signs, or the sign of the last
    element of an odd number of words, whose padding copies it) changed nothing before the rotation:
    2^63 x (an odd constant + 1) = 0 mod 2^64. Found by hypothesis in test_digest_binds_every_bit."""
    t = torch.tensor(values, dtype=torch.float32)
    bits = t.view(torch.int32).clone()
    for i in flips:
        bits[i] ^= -(1 << 31)
    assert eval_common.tree_digests([[bits.view(torch.float32)]])[0] != eval_common.tree_digests([[t]])[0]


@pytest.mark.parametrize("kind", sorted(DIGESTS))
def test_digest_depends_on_order_and_position(kind):
    digest = DIGESTS[kind]
    a, b = torch.arange(8.0), torch.arange(8.0).flip(0)
    assert digest([[a]]) != digest([[b]])
    assert digest([[a, b]]) != digest([[b, a]])


@pytest.mark.parametrize("kind", sorted(DIGESTS))
def test_a_batch_digests_as_its_calls_do(kind):
    """Stacked and chunked or one call at a time: the same numbers (the reference worker recomputes one)."""
    digest = DIGESTS[kind]
    calls = [[torch.randn(3, 5), torch.randn(7)] for _ in range(5)] + [[torch.randn(2)]]
    one_by_one = [digest([c])[0] for c in calls]
    assert digest(calls) == one_by_one
    if kind.startswith("gpu"):
        assert digest(calls, chunk_bytes=1) == one_by_one


def test_the_gpu_digest_is_not_linear():
    """Low bits tuned to hit a committed value: with a sum of per-element products (the old digest) two
    elements' changes cancel when their weighted differences do; a hash tree has no such structure. Here:
    the digest of the sum of two changes is not the sum of the two changes' digests."""
    x = torch.randn(64)
    d = eval_common.tree_digests
    base = d([[x]])[0]
    y1, y2, y12 = x.clone(), x.clone(), x.clone()
    for t, idx in ((y1, [3]), (y2, [40]), (y12, [3, 40])):
        for i in idx:
            t.view(torch.int32)[i] ^= 1
    wrap = lambda v: (v + (1 << 63)) % (1 << 64) - (1 << 63)
    assert d([[y12]])[0] != wrap(d([[y1]])[0] + d([[y2]])[0] - base)


# ------------------------------------------------------------------------------------------ tensor files
_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int32,
           torch.int64, torch.bool, torch.complex64]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(_DTYPES), st.lists(st.integers(0, 5), max_size=3), st.booleans()),
                max_size=4), st.integers(0, 2**31 - 1))
def test_a_tensor_file_gives_back_the_exact_tensors(specs, seed):
    """What a runner writes (trials' outputs, the timed outputs it ships) reads back bit for bit."""
    from evaluate_kernel import tensorfile
    g = torch.Generator().manual_seed(seed)
    tensors = []
    for dtype, shape, transposed in specs:
        t = (torch.randn(shape, generator=g) * 100).to(dtype) if shape else torch.tensor(3).to(dtype)
        tensors.append(t.t() if transposed and t.dim() == 2 else t)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "out.bin")
        tensorfile.write(path, {"0": tensors, "3:1": tensors[:1]})
        back = tensorfile.read(path, ["0", "3:1", "9"], 1 << 30)
    assert set(back) == {"0", "3:1"} and len(back["0"]) == len(tensors)
    for a, b in zip(tensors, back["0"]):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def test_a_tensor_file_that_lies_reads_as_nothing(tmp_path):
    """The reader believes nothing in the file: no pickle, torch dtypes by name only, byte ranges that match
    the dtype and shape and lie in the file, shapes torch can make, only the keys asked for and at most
    max_bytes of them (a header may declare terabytes, or junk beside the right outputs), a plain file only
    (a FIFO or a link read as missing). A lie costs the lying key only: the others still read. Bool bytes
    come back as written (the committed digests cover the raw bytes)."""
    import json
    import pickle
    from evaluate_kernel import tensorfile
    path = tmp_path / "f.bin"

    def raw(header, data: bytes = b"") -> None:
        head = json.dumps(header).encode()
        path.write_bytes(len(head).to_bytes(8, "little") + head + data)

    def read(keys=("0",), max_bytes=1 << 20):
        return tensorfile.read(str(path), list(keys), max_bytes)

    entry = {"dtype": "float32", "shape": [2], "offset": 0, "nbytes": 8}
    raw({"0": [entry]}, bytes(8))
    assert read()["0"][0].tolist() == [0.0, 0.0]
    for bad in ([dict(entry, nbytes=4)], [dict(entry, offset=8)], [dict(entry, dtype="object")],
                [dict(entry, dtype="__class__")], [dict(entry, dtype="Tensor")], [dict(entry, dtype="_inductor")],
                [dict(entry, shape=[-2])],
                [dict(entry, shape=[2.0])], [dict(entry, shape=[1 << 40], nbytes=4 << 40)],
                [dict(entry, shape=[0, 10 ** 30], nbytes=0)], [dict(entry, shape=[1 << 61, 1 << 61, 0], nbytes=0)],
                [dict(entry, shape=[1] * 100 + [2])], entry, "0"):
        raw({"0": bad, "1": [entry]}, bytes(8))
        assert read(["0", "1"]).keys() == {"1"}, bad
    raw(["not", "a", "dict"], bytes(8))
    assert read() == {}
    probe = subprocess.run([sys.executable, "-c", "import sys, json, tempfile, os\n"
                            f"sys.path.insert(0, {str(REPO)!r})\n"
                            "from evaluate_kernel import tensorfile\n"
                            "p = os.path.join(tempfile.mkdtemp(), 'f.bin')\n"
                            "h = json.dumps({'0': [{'dtype': '_inductor', 'shape': [], 'offset': 0, 'nbytes': 1}]}).encode()\n"
                            "open(p, 'wb').write(len(h).to_bytes(8, 'little') + h + bytes(8))\n"
                            "assert tensorfile.read(p, ['0'], 1 << 20) == {}\n"
                            "print('torch._inductor' in sys.modules)"], capture_output=True, text=True, timeout=120)
    assert probe.stdout.strip() == "False", probe.stdout + probe.stderr   # a dtype name imports nothing
    raw({"0": [entry], "junk": [dict(entry, shape=[1 << 28], nbytes=1 << 30)]}, bytes(8))
    assert read(max_bytes=8).keys() == {"0"} and read(max_bytes=4) == {}   # junk nobody asked for is not read
    deep = b"[" * 200_000 + b"]" * 200_000   # json's parser recurses: a RecursionError, not a ValueError
    path.write_bytes(len(deep).to_bytes(8, "little") + deep)
    assert read() == {}
    path.write_bytes(pickle.dumps({"0": [torch.zeros(2)]}))
    assert read() == {}
    raw({"0": [{"dtype": "bool", "shape": [3], "offset": 0, "nbytes": 3}]}, bytes([0, 1, 255]))
    assert read()["0"][0].view(torch.uint8).tolist() == [0, 1, 255]
    fifo, link = tmp_path / "fifo.bin", tmp_path / "link.bin"
    os.mkfifo(fifo)
    link.symlink_to(path)
    assert tensorfile.read(str(fifo), ["0"], 1 << 20) == {} and tensorfile.read(str(link), ["0"], 1 << 20) == {}
    assert tensorfile.read(str(tmp_path / "missing.bin"), ["0"], 1 << 20) == {}


# ------------------------------------------------------------------------------------------ private code
CODE_FILES = ["__init__.py", "worker.py", "evaluation.py", "common.py"]

def test_private_copy_is_restored_and_original_changes_are_reported_once(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in CODE_FILES:
        (src / name).write_text(f"# {name}\n")
    code = eval_sandbox.PrivateCode(str(tmp_path / "private"), source_dir=str(src))
    assert code.problems() == []
    copy = Path(code.path("worker.py"))
    os.chmod(copy.parent, 0o700)
    os.chmod(copy, 0o600)
    copy.write_text("# forged\n")
    assert any("private copy" in p for p in code.problems())
    assert copy.read_text() == "# worker.py\n" and code.problems() == []
    (src / "evaluation.py").write_text("# edited\n")
    assert any("evaluation.py" in p for p in code.problems())
    assert code.problems() == []  # reported once per change, not for every later candidate


def test_extra_names_in_the_private_copy_are_tampering_and_removed(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in CODE_FILES:
        (src / name).write_text(f"# {name}\n")
    code = eval_sandbox.PrivateCode(str(tmp_path / "private"), source_dir=str(src))
    os.chmod(code.dir, 0o700)
    (Path(code.dir) / "json").mkdir()
    (Path(code.dir) / "json" / "__init__.py").write_text("raise SystemExit\n")
    problems = code.problems()
    assert any("json" in p for p in problems), problems
    assert sorted(os.listdir(code.dir)) == sorted(CODE_FILES) and code.problems() == []


def test_the_private_copy_holds_the_whole_package():
    """Every module of the package is copied (nothing listed by hand that could go missing)."""
    src = Path(eval_sandbox.__file__).parent
    assert eval_sandbox.code_files(str(src)) == sorted(p.name for p in src.glob("*.py"))


def test_a_private_root_of_a_process_that_is_gone_is_swept(tmp_path, monkeypatch):
    """An Evaluator killed before it could close leaves its private root (code copy, caches, logs) in the
    temporary directory; the next Evaluator's start removes it (logs that say something after a day). The
    root's name says who made it: roots of
    live processes or of another PID namespace stay, and so does any other directory, whatever it holds
    (a candidate that could write in a cache called pacevolve-* left a forged owner file there, a link to a
    directory to chmod, and a FIFO: tenth red team)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.Popen([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]);"
                             "from evaluate_kernel.sandbox import private_root; print(private_root())", str(REPO)],
                            stdout=subprocess.PIPE, text=True, env=dict(os.environ, TMPDIR=str(tmp_path)))
    dead_root = Path(gone.communicate()[0].strip())
    assert dead_root.parent == tmp_path and dead_root.name.startswith(f"pacevolve-root-{gone.pid}-")
    (dead_root / "logs").mkdir()
    (dead_root / "logs" / "ref-0.log").write_text("a worker's last words")
    outside = tmp_path / "outside"   # a link in a swept root: its target keeps its mode and its files
    outside.mkdir(mode=0o755)
    (outside / "keep").write_text("x")
    (dead_root / "logs" / "link").symlink_to(outside)
    live_root = Path(eval_sandbox.private_root())
    ns = "".join(c for c in os.readlink("/proc/self/ns/pid") if c.isdigit())
    reused = tmp_path / f"pacevolve-root-{os.getpid()}-1-{ns}-x"   # our pid, another start: long gone
    reused.mkdir()
    elsewhere = tmp_path / f"pacevolve-root-{gone.pid}-1-1-x"    # another PID namespace: its pids mean nothing
    elsewhere.mkdir()
    cache = tmp_path / "pacevolve-bench-cache"   # a cache a candidate wrote in: an old-style mark, a FIFO
    cache.mkdir()
    (cache / "owner").write_text(f"{gone.pid} 0 {ns}")
    os.mkfifo(cache / "fifo")
    linked = tmp_path / f"pacevolve-root-{gone.pid}-1-{ns}-link"   # a link, not a directory
    linked.symlink_to(outside)
    assert eval_sandbox.sweep_private_roots() == 2
    assert not reused.exists()
    # the dead root's logs say something: they stay a day, the rest goes at once
    assert sorted(os.listdir(dead_root)) == ["logs"] and (dead_root / "logs" / "ref-0.log").exists()
    day_ago = time.time() - eval_sandbox.LOGS_KEPT_S - 60
    os.utime(dead_root / "logs", (day_ago, day_ago))
    eval_sandbox.sweep_private_roots()
    assert not dead_root.exists()
    assert (outside / "keep").exists() and outside.stat().st_mode & 0o777 == 0o755
    assert live_root.exists() and elsewhere.exists() and cache.exists() and linked.is_symlink()


def test_closing_removes_the_private_root_but_logs_with_something_to_say(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "pacevolve_helper.py").write_text(HELPER)
    e = ek.Evaluator(REF, device="cpu", cache_dir=str(tmp_path / "cache"), import_dirs=[str(tmp_path / "mods")],
                     eager_baseline=False)
    root = Path(e.log_dir).parent
    assert root.parent == tmp_path and root.name.startswith(f"pacevolve-root-{os.getpid()}-")
    e.close()
    assert not root.exists()   # its logs were empty
    root = Path(eval_sandbox.private_root())
    for d in ("code", "caches/tmp", "readout", "logs"):
        (root / d).mkdir(parents=True)
    (root / "logs" / "forks.log").write_text("")
    eval_sandbox.remove_tree(str(root), keep=str(root / "logs"))
    assert not root.exists()
    root.mkdir()
    for d in ("code", "caches/tmp", "readout", "logs"):
        (root / d).mkdir(parents=True)
    (root / "logs" / "build-1.log").write_text("error: ...")
    (root / "caches" / "tmp" / "x").write_text("x")
    eval_sandbox.remove_tree(str(root), keep=str(root / "logs"))
    assert sorted(os.listdir(root)) == ["logs"] and (root / "logs" / "build-1.log").read_text() == "error: ..."


# ------------------------------------------------------------------------------------------ end to end
HELPER = "def fused_tail(x):\n    import torch\n    return torch.relu(x)\n"
REF = '''import torch
import torch.nn as nn
from pacevolve_helper import fused_tail


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return fused_tail(x @ x.T)


def get_inputs():
    return [torch.randn(256, 512)]


def get_init_inputs():
    return []
'''
HONEST = '''import torch
import torch.nn as nn
from pacevolve_helper import fused_tail


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return fused_tail(torch.mm(x, x.t()))
'''
DAEMON = '''import builtins
import torch
import torch.nn as nn

builtins.exec("""
import os, sys
code = ("import os, time\\\\n"
        "if getattr(os, 'fo' + 'rk')() == 0:\\\\n"
        "    time.sleep(120)\\\\n"
        "os._exit(0)\\\\n")
try:   # in the builder; a CPU runner may not start processes at all
    os.posix_spawn(sys.executable, [sys.executable, "-c", code, "MARKER"], {}, setsid=True)
except OSError:
    pass
""")


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x @ x.T)
'''


@pytest.fixture(scope="module")
def ev(tmp_path_factory):
    e = _trust_evaluator(tmp_path_factory.mktemp("trust"))
    yield e
    e.close()


def _trust_evaluator(root: Path, **options) -> ek.Evaluator:
    """The CPU evaluator of these tests: REF, with HELPER on its import path."""
    (root / "mods").mkdir()
    (root / "mods" / "pacevolve_helper.py").write_text(HELPER)
    options.setdefault("keep_worker_dirs", True)   # candidates here report into their homes (_reports)
    return ek.Evaluator(REF, device="cpu", cache_dir=str(root / "cache"), log_dir=str(root / "logs"),
                        import_dirs=[str(root / "mods")], max_pairs=8, timing_s=1.5, run_timeout_s=60, **options)


def _reports(ev, prefix: str) -> list:
    """What candidates wrote into their homes (the only directories they write in: dirname of TMPDIR),
    kept by keep_worker_dirs, as JSON."""
    import json
    return [json.loads(p.read_text()) for p in Path(ev.cache_dir, "w").rglob(prefix + "*") if p.is_file()]


def test_import_dirs_reach_every_worker_and_logs_stay_in_log_dir(ev):
    r = ev.evaluate(HONEST)
    assert r.status == "ok", r.message
    logs = os.listdir(ev.log_dir)
    assert any(n.startswith("ref-") for n in logs), logs
    assert not (Path(ev.cache_dir) / "ref-0.log").exists()
    assert r.details["phases"].get("cpu_wait") is not None and "gpu_wait" not in r.details["phases"]
    t = r.details["timing"]
    # One call of every candidate batch checked (the warm-up's too), chosen after its digests arrived.
    assert len(r.details["timed_checks"]) == len(t["batches_cand_ms"]) * ev.opts.verify_per_batch
    assert all(c["ok"] for c in r.details["timed_checks"])
    assert r.details["confined"] == "yes" and "CPU time" in t["clock"]


def test_every_batch_is_checked_even_when_memory_is_tight(tmp_path):
    """batch_bytes tiny (one call a batch): every candidate batch still has a call checked, shipped and
    compared before the next batch starts, so no batch is ever known in advance to go unchecked (an
    earlier policy stopped checking once kept outputs filled a budget: a cheat computed only batch 0)."""
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "pacevolve_helper.py").write_text(HELPER)
    e = ek.Evaluator(REF, device="cpu", cache_dir=str(tmp_path / "cache"), import_dirs=[str(tmp_path / "mods")],
                     max_pairs=6, timing_s=3.0, run_timeout_s=60, batch_bytes=1)
    try:
        r = e.evaluate(HONEST)
    finally:
        e.close()
    assert r.status == "ok", r.message
    t = r.details["timing"]
    assert t["calls_per_batch"] == 1
    assert [c["call"] for c in r.details["timed_checks"]] == [f"{i}:0" for i in range(len(t["batches_cand_ms"]))]


def test_a_cached_build_whose_libraries_changed_is_rebuilt(ev):
    """A builder or runner of another candidate rewrote this build's library: the digest the parent kept
    no longer matches, so the build is not loaded but made again, and the message says why."""
    src = HONEST + "\n# cached-build test\n"
    first = ev.evaluate(src)
    assert first.status == "ok", first.message
    build_dir = Path(ev.cache_dir, "ext", ek.source_hash(src)[:16])
    (build_dir / "planted.so").write_bytes(b"not a library")
    again = ev.evaluate(src)
    assert again.status == "ok" and "tampering" in again.message, again.message
    assert not (build_dir / "planted.so").exists()
    third = ev.evaluate(src)
    assert third.details.get("build_cached") and "tampering" not in third.message


FILL = """
import os
with open(os.path.join(os.path.dirname(os.environ["TMPDIR"]), "left-behind"), "wb") as f:
    f.truncate(64 << 20)
"""


def test_what_a_candidate_writes_goes_with_it(tmp_path):
    """A builder's and a runner's files lie in their homes, removed once they are dead: a candidate that
    filled the cache's disk once left every later candidate failing (twenty-seventh red team)."""
    with _trust_evaluator(tmp_path, keep_worker_dirs=False) as ev:
        r = ev.evaluate(AT_IMPORT.replace("CODE", repr(FILL[::-1])))
        assert r.status == "ok", r.message
        assert not list(Path(ev.cache_dir).rglob("left-behind"))
        homes = Path(ev.cache_dir, "w")
    assert not [p for p in homes.rglob("*") if p.is_file()]   # nothing of any worker once it is closed


def test_a_failure_while_the_caches_disk_is_full_is_no_verdict(ev, monkeypatch):
    """A candidate alive at the same time can fill the cache's file system from its home, and every other
    candidate then fails for want of space: such a failure raises EvaluatorError (the run stops, nothing is
    stored) instead of being returned as the candidate's verdict; a success is still one."""
    from evaluate_kernel import evaluator as ev_module
    monkeypatch.setattr(ev_module, "free_bytes", lambda path: 5 << 20)
    with pytest.raises(ek.EvaluatorError, match="5 MiB free"):
        ev.evaluate(HONEST.replace("return", "raise RuntimeError('no space left'); return", 1))
    assert ev.evaluate(HONEST).status == "ok"


def test_a_failure_while_the_kernel_killed_for_memory_is_no_verdict(ev, monkeypatch):
    """Memory a candidate holds by a descriptor alone shows in no process's size, and the kernel, short of
    memory, killed the reference worker of an honest candidate evaluated beside it: a failure during
    which the kernel killed any process raises EvaluatorError instead of being the candidate's verdict."""
    from evaluate_kernel import evaluator as ev_module
    kills = iter(range(100, 200))
    monkeypatch.setattr(ev_module, "oom_kills", lambda: next(kills))
    with pytest.raises(ek.EvaluatorError, match="want of memory"):
        ev.evaluate(HONEST.replace("return", "raise RuntimeError('killed'); return", 1))
    assert ev.evaluate(HONEST).status == "ok"


def test_a_worker_that_cannot_start_is_the_machine_s_failure(tmp_path, monkeypatch):
    """A candidate can hold every process and thread the machine has (a builder's threads): a worker that
    cannot be started raises EvaluatorError, not the OSError of the start (which the search would take for
    a crash of its own)."""
    from evaluate_kernel import evaluator as ev_module
    with _trust_evaluator(tmp_path) as ev:
        def no_process(*a, **k):
            raise BlockingIOError(11, "Resource temporarily unavailable")
        monkeypatch.setattr(ev_module, "Worker", no_process)
        with pytest.raises(ek.EvaluatorError, match="could not be started"):
            ev.evaluate(HONEST + "\n# a source never built\n")


def test_device_info_is_public(ev):
    info = ev.device_info()
    assert info["device_name"] == "cpu" and "torch" in info and "ref_names" not in info


def _alive_with(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        found.append(int(entry))
            except OSError:
                pass
    return found


def test_daemons_started_by_a_candidate_are_killed(ev):
    """A setsid daemon with an empty environment that forks again (its parent exits) is found by
    ancestry (workers are child subreapers) and killed when the build ends."""
    marker = f"pacevolve-test-daemon-{os.getpid()}-{time.monotonic_ns()}"
    r = ev.evaluate(DAEMON.replace("MARKER", marker))
    assert r.status == "ok", r.message
    deadline = time.monotonic() + 5
    while _alive_with(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = _alive_with(marker)
    for pid in left:
        os.kill(pid, 9)
    assert not left, f"daemon processes survived the evaluation: {left}"
    assert r.details.get("stray_processes_killed", 0) >= 1


def test_find_processes_follows_the_environment_marker(tmp_path):
    mark = f"pv-test-{os.getpid()}-{time.monotonic_ns()}"
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            env=dict(os.environ, **{eval_sandbox.MARK_ENV: mark}), start_new_session=True)
    try:
        assert proc.pid in eval_sandbox.find_processes(set(), mark)
        eval_sandbox.kill_processes(set(), mark)
        time.sleep(0.2)   # dead by now: its status is still its Popen's to read (no one else reaped it)
        assert proc.wait(timeout=5) == -9
    finally:
        if proc.poll() is None:
            proc.kill()


# ------------------------------------------------------------------------------------------ namespace
PROBE_CODE = """
import ctypes, json, os, sys
report = {"pid": os.getpid(), "visible": [int(e) for e in os.listdir("/" + "proc") if e.isdigit()], "writes": {},
          "handles": {}, "locks": {}}
# No capability; the key's directory empty; a /dev/shm of its own; no socket among the descriptors it was
# given (a forked worker must not hold the fork server's).
with open("/" + "proc/self/status") as f:
    report["caps"] = {k: v.strip() for k, v in (l.split(":", 1) for l in f) if k.startswith("Cap")}
report["keys"] = os.listdir(KEYDIR) if os.path.isdir(KEYDIR) else ["(gone)"]
report["shm"] = os.listdir("/dev/shm")
report["dev"] = sorted(os.listdir("/dev"))
report["fds"] = [os.readlink(f"/{'proc'}/self/fd/{fd}") for fd in range(256) if os.path.exists(f"/{'proc'}/self/fd/{fd}")]
for d in TARGETS:
    try:
        with open(os.path.join(d, "pacevolve-probe.pth"), "w") as f:
            f.write("import sys\\n")
        report["writes"][d] = "written"
    except OSError as e:
        report["writes"][d] = type(e).__name__
# Past the read-only mounts by inode: a directory's file handle opened from "/" (the writable mount
# beneath the read-only bind), then a file made there.
class Handle(ctypes.Structure):
    _fields_ = [("bytes", ctypes.c_uint), ("type", ctypes.c_int), ("data", ctypes.c_ubyte * 128)]
libc = ctypes.CDLL(None, use_errno=True)
for d in TARGETS:
    h, mount = Handle(128), ctypes.c_int()
    if libc.name_to_handle_at(-100, d.encode(), ctypes.byref(h), ctypes.byref(mount), 0) != 0:
        report["handles"][d] = "name_to_handle_at errno %d" % ctypes.get_errno()
        continue
    root = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
    fd = libc.open_by_handle_at(root, ctypes.byref(h), os.O_RDONLY | os.O_DIRECTORY)
    if fd < 0:
        report["handles"][d] = "open_by_handle_at errno %d" % ctypes.get_errno()
        continue
    try:
        os.close(os.open("pacevolve-probe.pth", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
        report["handles"][d] = "written"
    except OSError as e:
        report["handles"][d] = type(e).__name__
# Every file system read-only but the cache: the root one (/etc/ld.so.preload would run code in every
# later process), the temp directory, /sys, and the kernel's knobs under /proc.
report["read_only"] = {p: bool(os.statvfs(p).f_flag & os.ST_RDONLY) for p in ["/", "/sys", "/proc/sys", TMPROOT]}
report["cache_writable"] = not os.statvfs(os.path.dirname(REPORT)).f_flag & os.ST_RDONLY
# The cache itself: veiled, but for the finished builds (read-only) and the worker's own home.
report["cache_root_writable"] = not os.statvfs(CACHE).f_flag & os.ST_RDONLY
report["logs_seen"] = os.listdir(LOGDIR) if os.path.isdir(LOGDIR) else ["(gone)"]
report["builder"] = os.environ.get("CUDA_VISIBLE_DEVICES") == ""
report["oom_score_adj"] = open("/" + "proc/self/oom_score_adj").read().strip()
report["cache_seen"] = sorted(os.listdir(CACHE))
report["homes_seen"] = [len(os.listdir(os.path.join(CACHE, "w", d))) for d in os.listdir(os.path.join(CACHE, "w"))]
# The machine's lock files: taken away, or a directory put in their place, every later evaluation on the
# machine would crash or stop taking turns.
for name in os.listdir(LOCKS):
    path = os.path.join(LOCKS, name)
    try:
        os.remove(path)
        os.mkdir(path)
        report["locks"][name] = "replaced"
    except OSError as e:
        report["locks"][name] = type(e).__name__
# No namespace of its own: a user namespace would give it every capability there (and with a network
# namespace, a loopback it could bring up).
report["unshare"] = libc.unshare(0x10000000 | 0x40000000)
# No network, not even loopback: a paced TCP socket keeps a kernel timer firing on the core that wrote
# to it, the reference's core while the runner is stopped.
import socket
try:
    a = socket.socket()
    a.bind(("127.0.0.1", 0))
    a.listen(1)
    b = socket.socket()
    b.settimeout(2)
    b.connect(a.getsockname())
    report["network"] = "connected"
except OSError as e:
    report["network"] = type(e).__name__
# An escape the process sweep alone misses: subreaper off, double fork, setsid, empty environment.
libc.prctl(36, 0, 0, 0, 0)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execve(sys.executable, [sys.executable, "-c", "import time; time.sleep(120)", "MARKER"], {})
    os._exit(0)
os.wait()
libc.prctl(36, 1, 0, 0, 0)
with open(REPORT + "-" + os.urandom(6).hex(), "w") as f:
    json.dump(report, f)
"""
PROBE = '''import builtins
import torch
import torch.nn as nn

builtins.exec(CODE[::-1])  # reversed: the screen reads strings too, and this test is about what lies past it


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x @ x.T)
'''


@pytest.fixture(scope="module")
def ev_exec(tmp_path_factory):
    """The evaluator of `ev` with its builders and runners started by exec, not by the fork server."""
    e = _trust_evaluator(tmp_path_factory.mktemp("trust-exec"), fork_server=False)
    yield e
    e.close()


@pytest.mark.parametrize("start", ["forked", "exec"])
def test_namespace_confines_builder_and_runner(start, request, tmp_path):
    """In the namespace, whether the worker was forked by the fork server or started by exec: the evaluator's
    code, source, the project it sits in, the home directory and the
    Python installation are read-only, also to a file handle opened past the mounts, and so is every other
    file system but the cache (the root one, the temp directory, /sys, the kernel's knobs); no socket
    connects, not even on loopback; the machine's lock files stay where they are; the evaluator's processes
    are invisible, and a daemon that leaves the worker's tree dies with it; no capability is left, the key's
    directory is empty, /dev and /dev/shm are the namespace's own, and the worker holds no socket. Evaluations after it
    still take their turns."""
    ev = request.getfixturevalue("ev" if start == "forked" else "ev_exec")
    if ev.isolation != "pid+mount+net namespace":
        pytest.skip(f"no namespace here: {ev.isolation}")
    if start == "forked" and ev.fork_server != "on":   # a CUDA build of torch starts a thread at import
        pytest.skip(f"no fork server here: {ev.fork_server}")
    assert ev.fork_server == ("on" if start == "forked" else "off")
    shm_marker = f"/dev/shm/pacevolve-test-{os.getpid()}-{time.monotonic_ns()}"
    open(shm_marker, "w").close()
    import site
    targets = [str(Path(ek.__file__).parent), str(REPO), os.path.expanduser("~"), site.getsitepackages()[0]]
    marker = f"pacevolve-test-escape-{os.getpid()}-{time.monotonic_ns()}"
    report = f"probe-{time.monotonic_ns()}"   # in the worker's home
    locks = os.path.dirname(eval_common.lock_path("pch.lock"))
    code = (PROBE_CODE.replace("TARGETS", repr(targets)).replace("CACHE", repr(ev.cache_dir))
            .replace("LOGDIR", repr(ev.log_dir))
            .replace("REPORT", f'os.path.join(os.path.dirname(os.environ["TMPDIR"]), {report!r})').replace("MARKER", marker)
            .replace("LOCKS", repr(locks)).replace("TMPROOT", repr(tempfile.gettempdir()))
            .replace("KEYDIR", repr(eval_sandbox.default_key_dir())))
    src = PROBE.replace("CODE", repr(code[::-1]))
    try:
        r = ev.evaluate(src)
    finally:
        os.remove(shm_marker)
    time.sleep(0.5)
    left = _alive_with(marker)
    for pid in left:
        os.kill(pid, 9)
    reports = _reports(ev, report)
    for d in targets:
        try:
            os.remove(os.path.join(d, "pacevolve-probe.pth"))
        except OSError:
            pass
    assert reports, r.message
    for rep in reports:
        assert all(v != "written" for v in rep["writes"].values()), rep["writes"]
        assert rep["handles"] and all(v != "written" for v in rep["handles"].values()), rep["handles"]
        assert all(v != "replaced" for v in rep["locks"].values()), rep["locks"]
        assert rep["builder"] is False or rep["locks"] == {}, rep["locks"]   # hidden from builders
        assert rep["logs_seen"] == [], rep["logs_seen"]   # no worker reads another's log live
        assert rep["oom_score_adj"] == "1000", rep   # the first the kernel kills for want of memory
        assert all(rep["read_only"].values()) and rep["cache_writable"], rep["read_only"]
        assert not rep["cache_root_writable"] and rep["cache_seen"] == ["ext", "w"] and rep["homes_seen"] == [1], rep
        assert rep["network"] != "connected", rep["network"]
        assert os.getpid() not in rep["visible"] and rep["pid"] < 100, rep
        assert rep["caps"] and all(int(v, 16) == 0 for v in rep["caps"].values()), rep["caps"]
        assert rep["keys"] == [] and os.path.basename(shm_marker) not in rep["shm"], rep
        assert not [f for f in rep["fds"] if f.startswith("socket:")], rep["fds"]
        assert "kvm" not in rep["dev"] and "kmsg" not in rep["dev"] and "null" in rep["dev"], rep["dev"]
        assert rep["unshare"] == -1, rep
    assert not left, f"escaped daemons survived: {left}"
    assert r.details.get("isolation") == "pid+mount+net namespace" or r.status != "ok"
    assert all(os.path.isfile(os.path.join(locks, n)) for n in os.listdir(locks) if ".not-a-lock-" not in n)
    assert ev.evaluate(HONEST).status == "ok"


PLANT = """
import os, sys
f, d = sys._getframe(1), None
while f is not None and d is None:
    job = f.f_locals.get("job")
    d = job.get("work_dir") if isinstance(job, dict) else None
    f = f.f_back
for i in range(100):
    try:
        os.symlink(os.path.join(TARGET, "escaped-%d" % i), os.path.join(d, "read-%d.out" % i))
    except (OSError, TypeError):
        pass
try:
    os.mkfifo(os.path.join(d, "read-reference.out"))
except (OSError, TypeError):
    pass
"""
LINKS = '''import builtins
import torch
import torch.nn as nn
from pacevolve_helper import fused_tail


class ModelNew(nn.Module):
    planted = False

    def __init__(self):
        super().__init__()

    def forward(self, x):
        if not ModelNew.planted:
            ModelNew.planted = True
            builtins.exec(CODE[::-1])
        return fused_tail(torch.mm(x, x.t()))
'''


def test_links_and_fifos_in_the_work_directory_reach_nothing(ev, tmp_path):
    """The runner's work directory is the candidate's to write: links there named as the files the parent
    writes for the reference worker lead nowhere (the parent writes them in a directory of its own; once a
    link there let a candidate have the parent, as root, write its bytes anywhere), and a FIFO there hangs
    nothing."""
    import threading
    target = tmp_path / "outside"
    target.mkdir()
    code = PLANT.replace("TARGET", repr(str(target)))
    box: dict = {}
    # In a thread of its own: the parent once blocked for good opening such a FIFO; fail, never hang.
    t = threading.Thread(target=lambda: box.update(r=ev.evaluate(LINKS.replace("CODE", repr(code[::-1])))),
                         daemon=True)
    t.start()
    t.join(180)
    assert "r" in box, "the evaluation hung on the candidate's FIFO"
    assert box["r"].status == "ok", box["r"].message
    assert list(target.iterdir()) == []


KEEP_OUT = """
import json, os
root, home, tmp = CACHE, os.path.dirname(os.environ["TMPDIR"]), os.environ["TMPDIR"]
seen = {}
for name, calls in (("chmod", [(os.chmod, root, 0)]), ("chmod_ext", [(os.chmod, os.path.join(root, "ext"), 0)]),
                    ("chmod_home", [(os.chmod, home, 0)]), ("chown", [(os.chown, root, 1, 1)]),
                    ("acl", [(os.setxattr, root, "system.posix_acl_access", bytes(4))]),
                    ("tmp_replaced", [(os.rename, tmp, tmp + "-gone"), (os.mkdir, tmp, 0)])):
    try:
        for call in calls:
            call[0](*call[1:])
        seen[name] = "done"
    except OSError as e:
        seen[name] = e.errno
with open(os.path.join(home, "keep-out-report"), "w") as f:
    json.dump(seen, f)
"""


def test_a_candidate_cannot_keep_later_candidates_out_of_the_cache(tmp_path):
    """Workers are root without capabilities and root owns the cache: a runner that took every permission
    off the cache's root once left every later builder and runner unable to enter it. Changing a mode, an
    owner or an ACL is refused in the namespace; a directory the parent relies on that a candidate made
    anew, keeping everyone out, is the parent's again at the next evaluation."""
    with _trust_evaluator(tmp_path) as ev:
        if ev.isolation != "pid+mount+net namespace":
            pytest.skip(f"no namespace here: {ev.isolation}")
        r = ev.evaluate(LINKS.replace("CODE", repr(KEEP_OUT.replace("CACHE", repr(ev.cache_dir))[::-1])))
        assert r.status == "ok", r.message
        reports = _reports(ev, "keep-out-report")
        assert reports, r.message
        for seen in reports:
            assert {k: v for k, v in seen.items() if k != "tmp_replaced"} == dict.fromkeys(
                ("chmod", "chmod_ext", "chmod_home", "chown", "acl"), 1), seen   # EPERM
            assert seen["tmp_replaced"] == "done"   # a rename and a mkdir in its own home are ordinary use
        after = ev.evaluate(HONEST)
        assert after.status == "ok", after.message
        assert os.stat(ev.cache_dir).st_mode & 0o700 == 0o700
        assert os.stat(os.path.join(ev.cache_dir, "ext")).st_mode & 0o700 == 0o700


MOVE_CORES = """
import json, os
before = sorted(os.sched_getaffinity(0))
target = {c for c in range(os.cpu_count() or 1) if c not in before} or {before[0]}
try:
    os.sched_setaffinity(0, target)
    answer = "done"
except OSError as e:
    answer = e.errno
with open(os.path.join(os.path.dirname(os.environ["TMPDIR"]), "cores-" + os.urandom(8).hex()), "w") as f:
    json.dump({"before": before, "target": sorted(target), "answer": answer,
               "after": sorted(os.sched_getaffinity(0))}, f)
"""
AT_IMPORT = '''import builtins
import torch
import torch.nn as nn

builtins.exec(CODE[::-1])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(torch.mm(x, x.t()))
'''


def test_a_builder_cannot_move_to_other_cores(ev):
    """Candidate code runs in the builder (its import) while other candidates' batches are timed, and on a
    GPU while the baseline is measured: its calls to move onto other cores (or raise its priority) report
    success and do nothing; in the runner they fail."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one core: nowhere to move")
    r = ev.evaluate(AT_IMPORT.replace("CODE", repr(MOVE_CORES[::-1])))
    reports = _reports(ev, "cores-")
    assert reports, r.message
    assert all(rep["after"] == rep["before"] for rep in reports), reports
    assert any(rep["answer"] == "done" for rep in reports), reports   # the builder's
    assert any(rep["answer"] == 1 for rep in reports), reports        # a runner's: EPERM
    assert r.status == "ok", r.message


IO_URING = """
import ctypes, json, os, platform
params = (ctypes.c_uint32 * 30)()
params[2], params[3], params[4] = 2 | 4, min(os.cpu_count() or 1, 64) - 1, 1000   # SQPOLL | SQ_AFF, sq_thread_cpu, idle ms
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.syscall({"x86_64": 425, "aarch64": 425}.get(platform.machine(), 425), 8, ctypes.byref(params))
answer = "ring" if fd >= 0 else ctypes.get_errno()
with open(os.path.join(os.path.dirname(os.environ["TMPDIR"]), "ring-" + os.urandom(8).hex()), "w") as f:
    json.dump({"answer": answer}, f)
"""


def test_no_worker_can_start_an_io_uring(ev):
    """A ring's kernel thread polls on whichever core the ring names (SQ_AFF), whatever the caller's
    affinity, and goes on after the caller is stopped: a builder's spun on the runner's core at 95%
    (twenty-seventh red team). io_uring_setup fails with EPERM in the builder and in the runner alike."""
    r = ev.evaluate(AT_IMPORT.replace("CODE", repr(IO_URING[::-1])))
    reports = _reports(ev, "ring-")
    assert len(reports) >= 2, r.message   # the builder's and the runner's (trial models import it again)
    assert all(rep["answer"] == 1 for rep in reports), reports
    assert r.status == "ok", r.message


FIFO = """
import json, os
home = os.path.dirname(os.environ["TMPDIR"])
try:
    os.mkfifo(os.path.join(home, "pipe"))
    answer = "made"
except OSError as e:
    answer = e.errno
with open(os.path.join(home, "fifo-" + os.urandom(8).hex()), "w") as f:
    json.dump({"answer": answer}, f)
"""


def test_no_worker_can_make_a_fifo(ev):
    """A FIFO can be opened for writing on a read-only mount: one a builder left in its build (then among
    the finished builds) carried another candidate's inputs to a third one's builder, 8.7x over the twin
    (twenty-eighth red team). mknod fails with EPERM in the builder and in the runner alike."""
    r = ev.evaluate(AT_IMPORT.replace("CODE", repr(FIFO[::-1])))
    reports = _reports(ev, "fifo-")
    assert len(reports) >= 2, r.message
    assert all(rep["answer"] == 1 for rep in reports), reports
    assert r.status == "ok", r.message


MACHINE_FIFO = """
import json, os
seen = {}
for name, flags in (("write", os.O_RDWR), ("read", os.O_RDONLY)):
    try:
        os.close(os.open(THE_FIFO, flags | os.O_NONBLOCK))
        seen[name] = "opened"
    except OSError as e:
        seen[name] = e.errno
with open(os.path.join(os.path.dirname(os.environ["TMPDIR"]), "machine-fifo-" + os.urandom(8).hex()), "w") as f:
    json.dump(seen, f)
"""


def _landlock() -> int:
    import ctypes
    return ctypes.CDLL(None, use_errno=True).syscall(444, None, ctypes.c_size_t(0), ctypes.c_uint32(1))


@pytest.mark.skipif(_landlock() < 1, reason="the kernel has no Landlock")
def test_no_worker_can_write_into_a_fifo_of_the_machine(ev, tmp_path):
    """A FIFO of the machine's (logind's session references under /run, init's control FIFO) opens for
    writing on a read-only mount, to a root worker whatever its mode: two candidates that open the same one
    have a pipe between them. Under Landlock a builder and a runner open for writing only what lies in
    their home, /dev/shm, /dev and /proc; reading stays as the mounts allow."""
    fifo = tmp_path / "machine.fifo"
    os.mkfifo(fifo, 0o600)
    r = ev.evaluate(AT_IMPORT.replace("CODE", repr(MACHINE_FIFO.replace("THE_FIFO", repr(str(fifo)))[::-1])))
    reports = _reports(ev, "machine-fifo-")
    assert len(reports) >= 2, r.message
    assert all(rep == {"write": 13, "read": "opened"} for rep in reports), reports
    assert r.status == "ok", r.message


UNIX_SOCKET = """
import json, os, socket
seen = {}
try:
    a = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    a.connect(HOST_SOCKET)
    a.sendall(b"hello")
    seen["connect"] = "connected"
except OSError as e:
    seen["connect"] = e.errno
try:
    socket.socketpair()[0].close()
    seen["pair"] = "made"
except OSError as e:
    seen["pair"] = e.errno
with open(os.path.join(os.path.dirname(os.environ["TMPDIR"]), "unix-" + os.urandom(8).hex()), "w") as f:
    json.dump(seen, f)
"""


def test_no_worker_can_reach_a_socket_file_of_the_machine(ev, tmp_path):
    """A socket file of the machine's that two candidates both reach is a channel between them no mount
    stops (connecting is no write: a root-owned 0600 socket took messages from a builder and a runner,
    twenty-eighth red team). No builder or runner can make a socket of the AF_UNIX family; socketpair (no
    file, no one else's) still works. (A GPU runner's filter is the same: the confinement test below.)"""
    import socket
    path = str(tmp_path / "host.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(8)
    os.chmod(path, 0o600)
    try:
        r = ev.evaluate(AT_IMPORT.replace("CODE", repr(UNIX_SOCKET.replace("HOST_SOCKET", repr(path))[::-1])))
    finally:
        server.close()
    reports = _reports(ev, "unix-")
    assert len(reports) >= 2, r.message
    assert all(rep == {"connect": 1, "pair": "made"} for rep in reports), reports
    assert r.status == "ok", r.message


SIGNALS = """
import ctypes, fcntl, json, os, socket, struct, torch
seen = {}
def tries(name, f):
    try:
        f()
        seen[name] = "done"
    except OSError as e:
        seen[name] = e.errno
shared = os.path.join(os.path.dirname(torch.__file__), "version.py")   # every worker reads it
fd = os.open(shared, os.O_RDONLY)
tries("flock", lambda: fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB))
tries("set_lock", lambda: fcntl.fcntl(fd, fcntl.F_SETLK, struct.pack("hhqqi", fcntl.F_RDLCK, 0, 7, 5, 0)))
tries("get_lock", lambda: fcntl.fcntl(fd, fcntl.F_GETLK, struct.pack("hhqqi", fcntl.F_RDLCK, 0, 0, 0, 0)))
tries("notify", lambda: fcntl.fcntl(os.open(os.path.dirname(shared), os.O_RDONLY), 1026, 1))
libc = ctypes.CDLL(None, use_errno=True)
seen["inotify"] = ctypes.get_errno() if libc.inotify_init1(0) < 0 else "made"
seen["fanotify"] = ctypes.get_errno() if libc.fanotify_init(0x200, 0) < 0 else "made"   # FAN_REPORT_FID
h = ctypes.create_string_buffer(136); h[0] = 128; m = ctypes.c_int()
seen["handle"] = ctypes.get_errno() if libc.name_to_handle_at(-100, shared.encode(), h, ctypes.byref(m), 0) < 0 else "made"
tries("dgram_pair", lambda: socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)[0].close())
tries("raw_pair", lambda: socket.socketpair(socket.AF_UNIX, socket.SOCK_RAW)[0].close())   # made a datagram one
tries("stream_pair", lambda: socket.socketpair()[0].close())
tries("vsock", lambda: socket.socket(40, socket.SOCK_STREAM).close())
tries("dev_times", lambda: os.utime("/dev/null"))   # the host's inode: its times were a channel
tries("dev_write", lambda: os.close(os.open("/dev/null", os.O_WRONLY)))
seen["process_madvise"] = ctypes.get_errno() if libc.syscall(440, 0, None, 0, 21, 0) < 0 else "done"
def resident():   # is the first page of the shared file in the page cache (mincore, through a mapping)?
    libc.mmap.restype, size, page = ctypes.c_void_p, os.fstat(fd).st_size, ctypes.create_string_buffer(1)
    at = libc.mmap(None, size, 1, 1, fd, 0)
    libc.mincore(ctypes.c_void_p(at), 1, page)
    libc.munmap(ctypes.c_void_p(at), size)
    return page.raw[0] & 1
os.pread(fd, 4096, 0)
tries("fadvise", lambda: os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED))
seen["still_cached"] = resident()
import mmap
m = mmap.mmap(fd, os.fstat(fd).st_size, prot=mmap.PROT_READ)
m[0]
tries("pageout", lambda: m.madvise(21))   # MADV_PAGEOUT
m.close()
seen["still_cached"] += resident()
with open(os.path.join(os.path.dirname(os.environ["TMPDIR"]), "signals-" + os.urandom(8).hex()), "w") as f:
    json.dump(seen, f)
"""


def test_no_worker_can_signal_another_through_locks_watches_or_datagrams(ev):
    """Channels between candidates alive at the same time that need no write and no socket file: a lock
    belongs to the file, not to a namespace (read locks a builder set on torch's version.py, their ranges
    spelling a message, were read by another candidate's runner with F_GETLK: thirtieth red team); a
    watch (inotify, F_NOTIFY, fanotify) on a file every worker reads sees another's opens and reads (about
    9.5 Mbit/s through fanotify: thirty-first red team); and a datagram
    socket, even one of a pair, can send to any datagram socket file of the machine's; and which pages of
    such a file are in the page cache, which a candidate can drop (fadvise) and another see (mincore). In
    a builder and a runner alike, locks do nothing (and report success: here one this process holds
    exclusively did not stop a shared one), asking for another's lock fails, so do watches and datagram
    pairs; a pair of connected sockets still works; advice to drop pages is taken and ignored."""
    import fcntl
    import torch
    with open(os.path.join(os.path.dirname(torch.__file__), "version.py")) as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        r = ev.evaluate(AT_IMPORT.replace("CODE", repr(SIGNALS[::-1])))
    reports = _reports(ev, "signals-")
    assert len(reports) >= 2, r.message
    want = {"flock": "done", "set_lock": "done", "get_lock": 1, "notify": 1, "inotify": 1, "fanotify": 1,
            "handle": 1, "dgram_pair": 1,
            "raw_pair": 1, "stream_pair": "done", "vsock": 1, "dev_times": 30, "dev_write": "done",
            "process_madvise": 1, "fadvise": "done", "pageout": "done", "still_cached": 2}
    assert all(rep == want for rep in reports), reports
    assert r.status == "ok", r.message


def test_a_builder_outside_a_namespace_keeps_its_locks():
    """Outside a namespace a builder takes the precompiled header's lock: confine_builder(locks=True)
    leaves locks alone (without them concurrent builds would read a half-written header)."""
    code = (f"import fcntl, os, sys\nsys.path.insert(0, {str(REPO)!r})\n"
            "from evaluate_kernel.confine import confine_builder\n"
            "fd = os.open(sys.argv[1], os.O_RDONLY)\n"
            "assert confine_builder(None, locks=sys.argv[2] == '1') == ''\n"
            "try:\n    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB); print('locked')\n"
            "except OSError as e:\n    print(e.errno)\n")
    import errno
    import fcntl
    import tempfile
    with tempfile.NamedTemporaryFile() as f:
        fcntl.flock(f, fcntl.LOCK_EX)   # held here: a real lock cannot be taken beside it
        for locks, want in (("1", str(errno.EWOULDBLOCK)), ("0", "locked")):
            out = subprocess.run([sys.executable, "-c", code, f.name, locks], capture_output=True, text=True, timeout=60)
            assert out.stdout.strip() == want, out.stdout + out.stderr


def test_a_lock_file_replaced_by_something_else_is_set_aside(tmp_path):
    """Outside a namespace nothing stops a process from putting a directory, a FIFO or a link where a
    lock file was: the evaluator sets it aside and locks a plain file, instead of raising or hanging."""
    import stat
    makers = (os.mkdir, os.mkfifo, lambda p: os.symlink(str(tmp_path / "elsewhere"), p))
    for k, make in enumerate(makers):
        path = str(tmp_path / f"{k}.lock")
        make(path)
        with eval_common.open_lock(path, create=True) as f:
            assert stat.S_ISREG(os.fstat(f.fileno()).st_mode)
        assert os.path.isfile(path) and not os.path.islink(path)
        assert len([n for n in os.listdir(tmp_path) if n.startswith(f"{k}.lock.not-a-lock-")]) == 1
    os.mkfifo(tmp_path / "worker.lock")
    with pytest.raises(OSError):   # a worker (no create) never locks what is not a lock file
        eval_common.open_lock(str(tmp_path / "worker.lock"))
    assert not (tmp_path / "elsewhere").exists()


def test_numbers_from_a_worker_are_finite_and_within_64_bits():
    """A runner's NaN, infinity or 400-digit integer reads as null: it fails the field's type check instead
    of reaching the parent's arithmetic (a 400-digit start-up mark once raised OverflowError out of
    evaluate())."""
    from evaluate_kernel.protocol import loads
    msg = loads('{"a": NaN, "b": -Infinity, "c": 1e999, "d": 1' + "0" * 400 + ', "e": 18446744073709551615,'
                ' "f": -9223372036854775808, "g": 0.25, "h": [Infinity, 3]}')
    assert msg == {"a": None, "b": None, "c": None, "d": None, "e": 18446744073709551615,
                   "f": -9223372036854775808, "g": 0.25, "h": [None, 3]}


OVERFLOW_MARKS = '''import builtins
import torch
import torch.nn as nn
builtins.exec('004 ** 01 :adbmal = emit.emit ;emit tropmi'[::-1])   # time.time() -> 10**400: the runner's start-up marks become huge integers


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x @ x.T)
'''


MANY_THREADS = '''import builtins
import torch
import torch.nn as nn
builtins.exec(%r[::-1])   # 100 sleeping threads: each could hold a wake-up aimed at the reference's batch


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x @ x.T)
''' % "import threading, time\n[threading.Thread(target=time.sleep, args=(600,), daemon=True).start() for _ in range(100)]"[::-1]


def test_a_runner_with_more_threads_than_allowed_is_rejected(ev):
    r = ev.evaluate(MANY_THREADS)
    assert r.status == "rejected" and "threads" in r.message, r.message


FIFO_OUTPUTS = '''import builtins
import torch
import torch.nn as nn
builtins.exec("\\nnepo_ofif = nepo.snitliub\\n)k** ,a* ,f(nepo_ nruter    \\n)k** ,a* ,llunved.so(nepo_ nruter        \\n)f(ofifkm.so        \\n:)'nib.'(htiwsdne.f dna )rts ,f(ecnatsnisi fi    \\n:)k** ,a* ,f(nepo_ofif fed\\nnepo.snitliub = nepo_\\nsnitliub ,so tropmi"[::-1])   # a FIFO where the trials' outputs (and any shipped ones) should be


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x @ x.T)
'''


def test_a_fifo_in_place_of_the_outputs_does_not_hang_the_reference_worker(ev):
    """The reference worker reads files the runner wrote: a FIFO there blocked it until its timeout (the
    device's lock held minutes per such candidate). It reads only plain files, and the next candidate finds
    it alive."""
    t0 = time.monotonic()
    r = ev.evaluate(FIFO_OUTPUTS)
    assert r.status != "ok" and time.monotonic() - t0 < 30, (r.status, r.message)
    assert ev.evaluate(HONEST).status == "ok"


@pytest.mark.parametrize("clock", ["10 ** 400", 'float("nan")'])
def test_start_up_marks_that_are_no_finite_numbers_are_ignored(ev, clock):
    r = ev.evaluate(OVERFLOW_MARKS.replace("'004 ** 01 :adbmal", f"'{clock[::-1]} :adbmal"))
    assert r.status == "ok", r.message
    assert "load" not in r.details.get("phases", {}) and "trials_split_s" not in r.details


# ------------------------------------------------------------------------------------------ parent's clock
def test_a_process_cpu_clock_counts_every_thread():
    """The CPU's clock: a process's CPU time from the kernel, threads that ended included."""
    from evaluate_kernel import stopped
    code = ("import threading, time\n"
            "def spin():\n    t = time.thread_time()\n    while time.thread_time() - t < 0.3: pass\n"
            "ts = [threading.Thread(target=spin) for _ in range(2)]\n"
            "[t.start() for t in ts]; [t.join() for t in ts]\nprint('done', flush=True)\ntime.sleep(30)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "done"
        assert stopped.cpu_seconds(proc.pid) > 0.6   # two threads x 0.3 s of their own CPU time, both ended
    finally:
        proc.kill()
        proc.wait(timeout=5)
    with pytest.raises(EOFError):
        stopped.cpu_seconds(proc.pid)


def test_a_candidate_whose_thread_holds_off_the_stop_is_rejected_before_the_reference_runs(monkeypatch):
    """A thread inside a system call that holds off SIGSTOP (state D: a long in-kernel copy, a vfork whose
    child waits) runs on after the stop, on the core the reference is timed on next. The wait for every
    thread gives up after a second; then the candidate is rejected instead of timing the reference beside
    it (the wait used to give up silently)."""
    from evaluate_kernel import evaluation, stopped
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert stopped.stop(proc.pid, wait_s=5.0) is True and stopped.running_states(proc.pid) == []
        os.kill(proc.pid, signal.SIGCONT)
        monkeypatch.setattr(stopped, "state", lambda pid, tid=None: "D")   # a thread that will not stop
        t = time.monotonic()
        assert stopped.stop(proc.pid, wait_s=0.2) is False and time.monotonic() - t >= 0.2
        monkeypatch.undo()

        class W:
            class proc:
                pid = -1
            mark = "none"
        e = object.__new__(evaluation.Evaluation)
        e.w, e._main, e.details, e.opts = W, proc.pid, {}, ek.Options()
        monkeypatch.setattr(evaluation, "find_processes", lambda roots, mark: set())
        monkeypatch.setattr(evaluation, "stop", lambda pid, signal_sent=False: False)
        monkeypatch.setattr(evaluation, "running_states", lambda pid: ["S", "D"])
        r = e._freeze()
        assert r is not None and r.status == "rejected" and "did not stop" in r.message and "state DS" in r.message
        monkeypatch.setattr(evaluation, "stop", lambda pid, signal_sent=False: True)
        assert e._freeze() is None
    finally:
        proc.kill()
        proc.wait(timeout=5)


def test_a_step_whose_thread_holds_off_the_stop_is_rejected(monkeypatch):
    """The stop that ends a batch's step waits a second for every thread too: a thread still inside a system
    call after that ran outside the step's clock (its CPU time read meanwhile), so the candidate is
    rejected there, not only if it still runs at the next wait, a second later."""
    from evaluate_kernel import clock, evaluation, steps
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        class W:
            def send(self, req):
                pass

            def recv(self, timeout):
                return {"kind": "done"}
        w = W()
        e = object.__new__(evaluation.Evaluation)
        e.w, e._main, e.details, e.opts, e.deadline = w, proc.pid, {}, ek.Options(), time.monotonic() + 60
        e.ev = type("Ev", (), {"device": "cpu"})()
        monkeypatch.setattr(steps, "cpu_seconds", lambda pid, stopped=False: 0.0)
        monkeypatch.setattr(steps, "running_states", lambda pid: ["D"])
        monkeypatch.setattr(steps, "stop", lambda pid, signal_sent=False: False)
        with pytest.raises(steps._LateStop) as late:
            e._let_go(w, proc.pid, {"cmd": "go"}, clock.Batch("cand", 1))
        r = steps._not_stopped({}, late.value.states)
        assert r.status == "rejected" and "did not stop" in r.message and "state D" in r.message
        monkeypatch.setattr(steps, "stop", lambda pid, signal_sent=False: True)
        assert e._let_go(w, proc.pid, {"cmd": "go"}, clock.Batch("cand", 1)) == {"kind": "done"}
    finally:
        proc.kill()
        proc.wait(timeout=5)


def test_a_process_is_read_with_every_thread_stopped(monkeypatch):
    """Linux brings a running thread's CPU time up to date only at scheduler events (a tick, 1-10 ms): read
    while it runs, a process shows up to a tick per running thread too little, and a runner that kept
    running past its answer would carry work out of the step (about 10% on conv_groupnorm_small). The
    parent reads the clock with every thread stopped, and the process runs on afterwards."""
    from evaluate_kernel import stopped
    code = ("import threading\ndef spin():\n    while True: pass\n"
            "[threading.Thread(target=spin, daemon=True).start() for _ in range(3)]\n"
            "print('go', flush=True)\nspin()\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    states, read = [], time.clock_gettime_ns

    def checked(clock_id):
        tids = os.listdir(f"/proc/{proc.pid}/task")
        states.append(sorted(stopped.state(proc.pid, t) for t in tids))
        return read(clock_id)

    try:
        assert proc.stdout.readline().strip() == "go"
        monkeypatch.setattr(stopped.time, "clock_gettime_ns", checked)
        values = [stopped.cpu_seconds(proc.pid) for _ in range(20)]
        monkeypatch.undo()
        time.sleep(0.05)
        later = stopped.cpu_seconds(proc.pid)   # it ran on meanwhile
    finally:
        proc.kill()
        proc.wait(timeout=5)
    assert len(states) == 20 and all(s == ["T"] * 4 for s in states), states
    assert values == sorted(values) and later > values[-1] + 0.01


def test_confinement_blocks_scheduling_timers_and_on_the_cpu_processes():
    """A runner's filter, as a candidate's code would meet it: no other cores, no priority, no timers, no
    AF_UNIX sockets, no processes (threads still start). On a GPU runner processes may start (the parent
    kills them and rejects)."""
    from evaluate_kernel.confine import confine
    code = (f"import os, sys, threading\nsys.path.insert(0, {str(REPO)!r})\n"
            "from evaluate_kernel.confine import confine\n"
            "print(repr(confine([0], no_processes=sys.argv[1] == 'cpu')))\n"
            "def tries(f):\n    try:\n        f(); return 'allowed'\n    except OSError as e:\n        return e.errno\n"
            "t = threading.Thread(target=lambda: None); t.start(); t.join()\n"
            "print(tries(lambda: os.sched_setaffinity(0, set(range(os.cpu_count())))),"
            " tries(lambda: os.setpriority(os.PRIO_PROCESS, 0, -5)),"
            " tries(lambda: os.waitpid(os.posix_spawn('/bin/true', ['/bin/true'], {}), 0)))\n"
            "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "print(ctypes.get_errno() if libc.syscall(425, 4, ctypes.create_string_buffer(128)) < 0 else 'allowed')\n"
            "import platform\nctx = ctypes.c_ulong(0)\n"
            "IO_SETUP = {'x86_64': 206, 'aarch64': 0}[platform.machine()]\n"
            "print(ctypes.get_errno() if libc.syscall(IO_SETUP, 8, ctypes.byref(ctx)) < 0 else 'allowed')\n"
            "h = ctypes.create_string_buffer(136); h[0] = 128; m = ctypes.c_int()\n"
            "print(ctypes.get_errno() if libc.name_to_handle_at(-100, b'/', h, ctypes.byref(m), 0) < 0 else 'allowed')\n"
            "import signal\n"
            "print(tries(lambda: signal.setitimer(signal.ITIMER_REAL, 60)),"
            " ctypes.get_errno() if libc.timerfd_create(1, 0) < 0 else 'allowed')\n"
            "import socket\n"
            "print(tries(lambda: socket.socket(socket.AF_UNIX).close()), tries(lambda: socket.socketpair()[0].close()),"
            " tries(lambda: socket.socket(socket.AF_INET).close()))\n")
    for device, spawn in (("cpu", "1"), ("cuda", "allowed")):
        out = subprocess.run([sys.executable, "-c", code, device], capture_output=True, text=True, timeout=60)
        lines = out.stdout.split("\n")
        assert lines[0] == "''", out.stdout + out.stderr
        assert lines[1].split() == ["1", "1", spawn], lines
        assert lines[2] == "1", lines   # io_uring_setup: EPERM (its kernel workers would outlive a SIGSTOP)
        assert lines[3] == "1", lines   # io_setup: EPERM (completions would land after the stop)
        assert lines[4] == "1", lines   # name_to_handle_at: EPERM (a handle reaches past read-only mounts)
        # Timers, on either device: they fire on the reference's core while the runner is stopped (on the CPU
        # charged to the reference's CPU time, on a GPU delaying its launches).
        assert lines[5].split() == ["1", "1"], lines
        # A socket file of the machine's reached by two candidates is a channel (the test above).
        assert lines[6].split() == ["1", "allowed", "allowed"], lines


def test_baseline_info_reports_the_protocols_self_check():
    """The baseline times the reference's own Model in a runner beside the reference worker: the same
    code on both sides, so their ratio (self_check) is the protocol's own error, near 1."""
    import tasks
    with ek.Evaluator.for_task(tasks.get("conv_groupnorm_small"), device="cpu") as ev:
        info = ev.baseline_info()
    assert info["median_ms"] > 0 and info["runner_ms"] > 0
    assert 0.8 < info["self_check"] < 1.25, info
    assert info["cores_note"] == ""   # the CPU's clock is the runners' CPU time: no note


def test_a_gpu_whose_runners_share_their_cores_says_so():
    """Started with too few cores (under taskset, say), a GPU's runners share them with builds: the
    fixed cost read 9x on one core, and small calls' timings are noisier. The user is told, once."""
    from evaluate_kernel.evaluator import cores_note
    assert cores_note("cpu", False, 1) == "" and cores_note("cuda", True, 16) == ""
    note = cores_note("cuda", False, 1)
    assert "1 core(s)" in note and "at least 3 physical cores" in note


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.bool, torch.int8, torch.float64])
def test_the_gpu_digest_reads_every_dtype_as_words(dtype):
    """The hash tree starts from each output's bytes as 64-bit words (the last one padded): sizes that
    are no multiple of eight bytes, stacked or alone, give the same numbers, and every byte counts."""
    calls = [[(torch.randn(n) * 4).to(dtype)] for n in (1, 3, 5, 8, 13)] * 2
    d = eval_common.tree_digests
    assert d(calls) == [d([c])[0] for c in calls]
    x = (torch.randn(13) * 4).to(dtype)
    y = x.clone()
    y.view(torch.uint8)[-1] ^= 1     # the last byte, in the padded word
    assert d([[x]]) != d([[y]])


# The GPU digest written out in plain Python integers (64-bit, unsigned), for one float32 output.
_MASK = (1 << 64) - 1
_G, _SEED, _M1, _M2 = 0x9E3779B97F4A7C15, 0x232BE59BD9B4E019, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def _mix(x):
    x &= _MASK
    x ^= x >> 30
    x = x * _M1 & _MASK
    x ^= x >> 27
    x = x * _M2 & _MASK
    return x ^ (x >> 31)


def _unmix(y):
    y ^= (y >> 31) ^ (y >> 62)
    y = y * pow(_M2, -1, 1 << 64) & _MASK
    y ^= (y >> 27) ^ (y >> 54)
    y = y * pow(_M1, -1, 1 << 64) & _MASK
    return y ^ (y >> 30) ^ (y >> 60)


def _words_of(x):
    raw = x.numpy().tobytes()
    return [int.from_bytes(raw[i:i + 8], "little") for i in range(0, len(raw), 8)]


def _tree_of(level):
    while len(level) > 1:
        level = [_mix(level[i] * _G + level[i + 1]) for i in range(0, len(level), 2)]
    return level[0]


def _digest_of(words, bottom):
    v = [(w + i * _G + _SEED) & _MASK for i, w in enumerate(words)]
    root = _tree_of(bottom(v))
    d = _mix(_SEED * _G + root)
    return d - (1 << 64) if d >> 63 else d


def _rotl17(b):
    return ((b << 17) | (b >> 47)) & _MASK


def _pairs(v):   # the documented bottom level
    return [_mix(a * _G + b) ^ _mix(_rotl17(b) * _M1 + a) for a, b in zip(v[0::2], v[1::2])]


def _bijections(v):   # a bottom of bijections: each word mixed, then pairs as above
    return [_mix(_mix(a) * _G + _mix(b)) for a, b in zip(v[0::2], v[1::2])]


def test_the_gpu_digest_is_the_documented_construction():
    for n in (8, 16, 32):
        x = torch.randn(n)
        assert eval_common.tree_digests([[x]])[0] == _digest_of(_words_of(x), _pairs)


def test_no_word_of_an_output_can_be_solved_for_from_a_committed_digest():
    """A forger commits the digest of garbage, later computes the right output of the call chosen for the
    check and solves for its last word so that the digest matches (then retries its neighbours' free low
    bits until that word lies within tolerance too). Every step above the bottom is a bijection in either
    child, so the solve reaches the bottom; with a bottom of bijections it reaches the word itself."""
    garbage, right = torch.randn(8), torch.randn(8)
    for bottom, solvable in ((_bijections, True), (_pairs, False)):
        target = _digest_of(_words_of(garbage), bottom) & _MASK
        w = _words_of(right)
        v = [(x + i * _G + _SEED) & _MASK for i, x in enumerate(w)]
        root = (_unmix(target) - _SEED * _G) & _MASK
        left = bottom(v)[0]
        node = (_unmix(root) - left * _G) & _MASK                 # what the right pair must give
        last = (_unmix((_unmix(node) - _mix(v[2]) * _G) & _MASK) - 3 * _G - _SEED) & _MASK   # as for bijections
        forged = _digest_of(w[:3] + [last], bottom) & _MASK
        assert (forged == target) is solvable

"""Cached builds across Evaluators: a BUILT marker in the writable cache counts only when signed with the key
candidates cannot read (eval_sandbox.BuildSeal, hidden by the namespace); without a namespace a fresh
Evaluator trusts no marker it did not write (CPU, CI).

One C++ candidate is built twice (~10-30 s each on 2 cores); the others are pure Python.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evaluate_kernel import namespace as eval_namespace
from evaluate_kernel import sandbox as eval_sandbox
import evaluate_kernel as ek

REF = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x @ x.T)


def get_inputs():
    return [torch.randn(128, 256)]


def get_init_inputs():
    return []
'''
HONEST_CPP = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

ext = load_inline(name="relu_gram_cpp", functions=["relu_gram"], cpp_sources=r"""
torch::Tensor relu_gram(torch::Tensor x) { return torch::relu(torch::mm(x, x.t())); }
""")


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return ext.relu_gram(x)
'''
# Runs in the cheat's builder and runner: rewrite the honest build's library (still a loadable ELF with a
# tail) and its marker, with the digest from the worker's own copy of eval_sandbox.library_digest and, if
# the key can be read, a valid tag. A marker holding only a digest would now vouch for the forged library.
FORGE = r"""
import hashlib, hmac, json, os
from evaluate_kernel import namespace as eval_namespace
from evaluate_kernel import sandbox as eval_sandbox
target, key_path, report = TARGET, KEY_PATH, REPORT
try:
    with open(key_path, "rb") as f:
        key = f.read()
    seen = "read"
except OSError as e:
    key, seen = b"", type(e).__name__
for here, dirs, files in os.walk(target):
    for name in files:
        if name.endswith(".so"):
            with open(os.path.join(here, name), "ab") as f:
                f.write(b"forged")
digest = eval_sandbox.library_digest(target)
tag = hmac.new(key, ("pacevolve-build\0" + SOURCE_HASH + "\0" + digest).encode(), hashlib.sha256).hexdigest()
with open(os.path.join(target, "BUILT"), "w") as f:
    f.write(digest + "\n" + tag + "\n")
with open(report + "-" + os.urandom(6).hex(), "w") as f:
    json.dump({"key": seen}, f)
"""
CHEAT = '''import builtins
import torch
import torch.nn as nn

builtins.exec(CODE[::-1])  # reversed: this test is about what lies past the screen


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(torch.mm(x, x.t()))
'''
HONEST_PY = CHEAT.replace("builtins.exec(CODE[::-1])  # reversed: this test is about what lies past the screen\n", "")
NAMESPACE = eval_namespace.namespace_problem()


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("marker")


def _evaluator(root: Path, **kw) -> ek.Evaluator:
    return ek.Evaluator(REF, device="cpu", cache_dir=str(root / "cache"), key_dir=str(root / "keys"),
                        max_pairs=4, timing_s=2.0, run_timeout_s=60, build_timeout_s=300, **kw)


def _build_dir(root: Path, src: str = HONEST_CPP) -> Path:
    return root / "cache" / "ext" / ek.source_hash(src)[:16]


def _cheat(root: Path) -> str:
    h = ek.source_hash(HONEST_CPP)
    code = (FORGE.replace("TARGET", repr(str(_build_dir(root))))
            .replace("KEY_PATH", repr(str(root / "keys" / eval_sandbox.KEY_NAME)))
            .replace("REPORT", repr(str(root / "cache" / "forge-report"))).replace("SOURCE_HASH", repr(h)))
    return CHEAT.replace("CODE", repr(code[::-1]))


def _libraries(build_dir: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(build_dir.rglob("*.so")))


@pytest.mark.slow
@pytest.mark.skipif(bool(NAMESPACE), reason=f"no namespace here: {NAMESPACE}")
def test_a_forged_marker_is_not_trusted_and_an_honest_one_is(root):
    """Another candidate rewrites a built library and its marker (digest recomputed, key hidden from it): a
    fresh Evaluator rebuilds; a build it then signed is reused by the next fresh Evaluator."""
    with _evaluator(root) as ev:
        honest = ev.evaluate(HONEST_CPP)
        assert honest.status == "ok", honest.message
        cheat = ev.evaluate(_cheat(root))
    reports = [json.loads(p.read_text()) for p in (root / "cache").glob("forge-report-*")]
    assert reports and all(r["key"] != "read" for r in reports), reports  # the key is hidden in the namespace
    build = _build_dir(root)
    assert b"forged" in _libraries(build), cheat.message
    forged_digest = (build / "BUILT").read_text().split()[0]
    assert forged_digest == eval_sandbox.library_digest(str(build))  # an unsigned digest would vouch for it

    with _evaluator(root) as fresh:
        again = fresh.evaluate(HONEST_CPP)
    assert again.status == "ok", again.message
    assert not again.details.get("build_cached") and "signature" in again.details.get("build_note", "")
    assert b"forged" not in _libraries(build)

    with _evaluator(root) as later:
        cached = later.evaluate(HONEST_CPP)
        assert later.evaluate(HONEST_PY).status == "ok"  # a signed marker for the test below
    assert cached.status == "ok" and cached.details.get("build_cached"), cached.details


def test_without_a_namespace_a_fresh_evaluator_trusts_only_its_own_builds(root):
    """Even a validly signed marker (where the namespace test ran) is not believed."""
    marker = _build_dir(root, HONEST_PY) / "BUILT"
    if marker.exists():
        seal = eval_sandbox.BuildSeal(str(root / "keys"))
        assert seal.opened(ek.source_hash(HONEST_PY), marker.read_text())
    else:  # the namespace test did not run: make a marker first
        with _evaluator(root, isolate=False) as ev:
            assert ev.evaluate(HONEST_PY).status == "ok"
    with _evaluator(root, isolate=False) as fresh:
        assert not (root / "keys" / eval_sandbox.KEY_NAME).exists()  # deleted: its candidates could read it
        first = fresh.evaluate(HONEST_PY)
        second = fresh.evaluate(HONEST_PY)
    assert first.status == "ok" and not first.details.get("build_cached"), first.details
    assert "not trusted without a namespace" in first.details.get("build_note", "")
    assert second.status == "ok" and second.details.get("build_cached")  # its own build, digest in memory


# ------------------------------------------------------------------------------------------ the digest
def test_the_digest_covers_what_ninja_would_relink_from(tmp_path):
    """An object file replaced (its mtime set back, the library untouched) is relinked by ninja in a runner
    whose call stamp was changed: both count. Ninja's logs and the parent's files only trigger rebuilds."""
    ext = tmp_path / "relu_gram_cpp"
    ext.mkdir()
    for name in ("main.cpp", "main.o", "relu_gram_cpp.so", "build.ninja", "pacevolve-call.sha256", ".ninja_log",
                 ".ninja_deps", "lock"):
        (ext / name).write_bytes(name.encode())
    (tmp_path / "BUILT").write_text("x")
    (tmp_path / "build.log").write_text("x")
    before = eval_sandbox.library_digest(str(tmp_path))
    for name in (".ninja_log", ".ninja_deps", "lock"):
        (ext / name).write_bytes(b"changed")
    (tmp_path / "BUILT").write_text("y")
    (tmp_path / "build.log").write_text("y")
    assert eval_sandbox.library_digest(str(tmp_path)) == before
    for name in ("main.o", "pacevolve-call.sha256", "build.ninja"):
        original = (ext / name).read_bytes()
        (ext / name).write_bytes(b"forged")
        assert eval_sandbox.library_digest(str(tmp_path)) != before, name
        (ext / name).write_bytes(original)
    (ext / "evil.o").symlink_to(tmp_path / "elsewhere")
    assert eval_sandbox.library_digest(str(tmp_path)) != before


def test_files_the_parent_reads_or_writes_in_the_cache_are_never_reached_through_links_or_fifos(tmp_path):
    """The cache is the candidates' to write, and the evaluator runs as root: a marker is written to a fresh
    file that replaces whatever stands at its name (a link to a file elsewhere stays unwritten, a FIFO
    hangs nothing), through directories opened without following links; files are read only when plain
    (a FIFO in a build reads as missing, at once)."""
    victim = tmp_path / "victim"
    victim.write_text("precious")
    build = tmp_path / "top" / "ext" / "abc"
    build.mkdir(parents=True)
    (build / "BUILT").symlink_to(victim)
    eval_sandbox.write_under(str(tmp_path / "top"), ["ext", "abc"], "BUILT", b"marker")
    assert victim.read_text() == "precious" and (build / "BUILT").read_text() == "marker"
    assert not (build / "BUILT").is_symlink()
    os.remove(build / "BUILT")
    os.mkfifo(build / "BUILT")
    eval_sandbox.write_under(str(tmp_path / "top"), ["ext", "abc"], "BUILT", b"again")
    assert (build / "BUILT").read_text() == "again"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.rename(tmp_path / "top" / "ext", tmp_path / "ext-moved")
    (tmp_path / "top" / "ext").symlink_to(elsewhere)
    (elsewhere / "abc").mkdir()
    with pytest.raises(OSError):
        eval_sandbox.write_under(str(tmp_path / "top"), ["ext", "abc"], "BUILT", b"through a link")
    assert list((elsewhere / "abc").iterdir()) == []
    os.mkfifo(build.parent.parent.parent / "ext-moved" / "abc" / "fifo.o")
    assert eval_sandbox.read_plain(str(tmp_path / "ext-moved" / "abc" / "fifo.o")) is None
    assert eval_sandbox.read_plain(str(victim)) == b"precious"
    (tmp_path / "link").symlink_to(victim)
    assert eval_sandbox.read_plain(str(tmp_path / "link")) is None
    eval_sandbox.library_digest(str(tmp_path / "ext-moved"))   # returns: the FIFO is not opened


def test_the_cache_s_own_directories_and_large_files(tmp_path):
    """A file or link where the cache's own directories go is set aside and the directory made; a file
    larger than the digest's cap digests as its size, unread."""
    (tmp_path / "ext").write_text("not a directory")
    eval_sandbox.own_dir(str(tmp_path / "ext"))
    assert (tmp_path / "ext").is_dir() and any(p.name.startswith("ext.not-a-directory-") for p in tmp_path.iterdir())
    (tmp_path / "tmp").symlink_to(tmp_path / "elsewhere")
    eval_sandbox.own_dir(str(tmp_path / "tmp"))
    assert (tmp_path / "tmp").is_dir() and not (tmp_path / "tmp").is_symlink()
    (tmp_path / "big.o").write_bytes(b"x" * 2048)
    assert eval_sandbox.digest_plain(str(tmp_path / "big.o"), max_bytes=1024) == b"too large: 2048"
    assert eval_sandbox.digest_plain(str(tmp_path / "big.o")) == hashlib.sha256(b"x" * 2048).digest()


SPOIL_EXT = """
import os
ext = os.path.dirname(os.environ["TORCH_EXTENSIONS_DIR"])
os.rename(ext, ext + ".gone")
with open(ext, "w") as f:
    f.write("not a directory")
"""


def test_a_file_in_place_of_the_builds_directory_stops_no_later_evaluation(tmp_path):
    """A candidate replaces cache/ext with a plain file: later evaluations still build and run (it made
    every later evaluate() raise FileExistsError)."""
    with _evaluator(tmp_path / "root") as ev:
        ev.evaluate(CHEAT.replace("CODE", repr(SPOIL_EXT[::-1])))
        r = ev.evaluate(HONEST_PY)
    assert r.correct, r.message


PLANT_MARKER = """
import os
d = os.environ["TORCH_EXTENSIONS_DIR"]
os.makedirs(d, exist_ok=True)
if os.access(d, os.W_OK) and not os.statvfs(d).f_flag & os.ST_RDONLY:   # in the builder (its home)
    for name in ("BUILT", "build.log"):
        try:
            os.remove(os.path.join(d, name))
        except OSError:
            pass
        os.symlink(VICTIM, os.path.join(d, name))
    # then the build's whole directory: a link to another one
    os.rename(d, d + ".moved")
    os.symlink(VICTIM_DIR, d)
"""


def test_a_candidate_cannot_have_its_marker_written_through_a_link(tmp_path):
    """A candidate's builder puts links to a file outside the namespace's reach where its build's marker
    and log go, then a link to a directory there in place of its build's directory: the evaluator (root)
    writes through none of them (it once moved the build's log, the candidate's text, into that
    directory)."""
    victim, victim_dir = tmp_path / "victim", tmp_path / "victims"
    victim.write_text("precious")
    victim_dir.mkdir()
    code = PLANT_MARKER.replace("VICTIM_DIR", repr(str(victim_dir))).replace("VICTIM", repr(str(victim)))
    with _evaluator(tmp_path / "root") as ev:
        r = ev.evaluate(CHEAT.replace("CODE", repr(code[::-1])))
    assert r.correct, r.message
    assert victim.read_text() == "precious" and list(victim_dir.iterdir()) == []


REWRITE_BUILDS = """
import json, os
tried = {}
for top, _, files in os.walk(os.path.join(CACHE, "ext")):
    for name in files:
        path = os.path.join(top, name)
        try:
            with open(path, "r+b") as f:
                f.write(bytes(64))   # a library's ELF header zeroed
            tried[path] = "written"
        except OSError as e:
            tried[path] = e.errno
for path in (os.path.join(CACHE, "shared.bin"), os.path.join(CACHE, "ext", "planted")):
    try:
        open(path, "wb").close()
        tried[path] = "written"
    except OSError as e:
        tried[path] = e.errno
with open(os.path.join(os.path.dirname(os.environ["TMPDIR"]), "rewrite-" + os.urandom(8).hex()), "w") as f:
    json.dump(tried, f)
"""


def test_no_candidate_can_write_a_build_or_anything_another_worker_reads(root):
    """The finished builds are read-only to every builder and runner, and the cache beyond their own homes
    is too: a builder that zeroed the ELF header of each new build right after its digest broke every later
    candidate (runtime_error: invalid ELF header), and a runner that slept while another candidate's builder
    computed its calls through a file in the cache read 10.4x against its twin's 1.0x (twenty-seventh red
    team)."""
    import errno
    import json
    with _evaluator(root, keep_worker_dirs=True) as ev:
        built = ev.evaluate(HONEST_PY)   # its build: a directory and the parent's marker (no compile: quick)
        assert built.status == "ok", built.message
        r = ev.evaluate(CHEAT.replace("CODE", repr(REWRITE_BUILDS.replace("CACHE", repr(ev.cache_dir))[::-1])))
        assert r.status == "ok", r.message
        reports = [json.loads(p.read_text()) for p in Path(ev.cache_dir, "w").rglob("rewrite-*")]
        again = ev.evaluate(HONEST_PY)
    assert len(reports) >= 2, r.message   # the builder's and the runner's
    for tried in reports:
        assert tried and all(v in (errno.EROFS, errno.EPERM, errno.EACCES) for v in tried.values()), tried
        assert any(p.endswith("BUILT") for p in tried), tried   # a library is a file there like any other
    assert again.status == "ok" and again.details.get("build_cached") and "tampering" not in again.message, again.message


SET_UID = """
import os
d = os.environ["TORCH_EXTENSIONS_DIR"]
os.makedirs(d, exist_ok=True)
if not os.statvfs(d).f_flag & os.ST_RDONLY:   # in the builder (its home)
    os.close(os.open(os.path.join(d, "run-as-root"), os.O_CREAT | os.O_WRONLY, 0o6755))
"""


def test_a_build_holds_no_set_user_id_file(tmp_path):
    """The builder is root (without capabilities): a file it creates with mode 6755 is a set-user-ID root
    program, and its build directory becomes part of the cache. The parent clears those bits when it
    moves the build there."""
    import stat
    with _evaluator(tmp_path / "root") as ev:
        r = ev.evaluate(CHEAT.replace("CODE", repr(SET_UID[::-1])))
        ext = Path(ev.cache_dir, "ext")
        modes = {p.name: p.lstat().st_mode for p in ext.rglob("*") if p.is_file() and not p.is_symlink()}
    assert r.correct, r.message
    assert "run-as-root" in modes, modes
    assert not [n for n, m in modes.items() if m & (stat.S_ISUID | stat.S_ISGID)], {n: oct(m) for n, m in modes.items()}


def _deep(top: Path, levels: int) -> None:
    """A directory chain `levels` deep under top (made by descriptors: its paths outgrow the kernel's limit)."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(levels):
        os.mkdir("d", dir_fd=fd)
        nxt = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = nxt
    os.close(os.open("f", os.O_WRONLY | os.O_CREAT, dir_fd=fd))
    os.fchmod(fd, 0)
    os.close(fd)


def test_trees_a_candidate_makes_are_walked_and_removed_at_any_depth(tmp_path):
    """Python's own walk and rmtree recurse once a level: a 1,500-deep tree in a build made evaluate()
    raise RecursionError at every later evaluation of that source, and one in a runner's home made every
    later Evaluator's start raise (twenty-eighth red team). The parent's walk and removal use neither
    recursion nor paths longer than the kernel's limit; a link is removed, never followed."""
    top = tmp_path / "tree"
    top.mkdir()
    _deep(top, 3000)
    (tmp_path / "kept").write_text("x")
    os.symlink(tmp_path / "kept", top / "link")
    assert sum(1 for _ in eval_sandbox.walk(str(top))) > 1000
    assert len(eval_sandbox.library_digest(str(top))) == 64
    eval_sandbox.remove_all(str(top))
    assert not top.exists() and (tmp_path / "kept").read_text() == "x"


def test_a_build_s_tree_is_tidied_before_it_joins_the_finished_builds(tmp_path):
    """What no build holds is taken out before the move: a FIFO (opened for writing on a read-only mount,
    it carried one candidate's inputs to another's builder: 8.7x over the twin), set-user-ID bits; a tree
    too deep is refused; a name that is not UTF-8 digests (it made evaluate() raise)."""
    import stat
    from evaluate_kernel import builds
    build = tmp_path / "build"
    (build / "ext").mkdir(parents=True)
    os.mkfifo(build / "ext" / "pipe")
    (build / "ext" / "lib.so").write_bytes(b"ELF")
    os.chmod(build / "ext" / "lib.so", 0o6755)
    (build / os.fsdecode(b"name-\xff")).write_bytes(b"x")
    assert builds._tidy(str(build)) is None
    assert not (build / "ext" / "pipe").exists()
    assert not (build / "ext" / "lib.so").stat().st_mode & (stat.S_ISUID | stat.S_ISGID)
    assert len(eval_sandbox.library_digest(str(build))) == 64
    _deep(build, builds.MAX_BUILD_DEPTH + 2)
    assert "deeper" in builds._tidy(str(build))


DEEP_TREE = """
import os
home = os.path.dirname(os.environ["TMPDIR"])
d = os.environ["TORCH_EXTENSIONS_DIR"]
os.makedirs(d, exist_ok=True)
top = d if not os.statvfs(d).f_flag & os.ST_RDONLY else (home if WHERE == "runner" else None)
if top and (WHERE == "runner") == (top == home):
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(1500):
        os.mkdir("d", dir_fd=fd)
        nxt = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = nxt
"""


def test_a_deep_tree_in_a_build_or_a_home_leaves_no_trace(tmp_path):
    """A builder's 1,500-deep tree: the build is refused, with the reason, and nothing stays; a runner's in
    its home: the verdict stands, the home goes, and the Evaluator closes and starts again cleanly."""
    with _evaluator(tmp_path / "root") as ev:
        built = ev.evaluate(CHEAT.replace("CODE", repr(DEEP_TREE.replace("WHERE", repr("builder"))[::-1])))
        ran = ev.evaluate(CHEAT.replace("CODE", repr(DEEP_TREE.replace("WHERE", repr("runner"))[::-1])))
        after = ev.evaluate(HONEST_PY)
        homes = Path(ev.cache_dir, "w")
    assert built.status == "rejected" and "deeper than" in built.message, built.message
    assert ran.status == "ok", ran.message
    assert after.status == "ok", after.message
    assert not [p for p in homes.rglob("*") if p.is_file()]
    with _evaluator(tmp_path / "root") as again:
        assert again.evaluate(HONEST_PY).status == "ok"


# ------------------------------------------------------------------------------------------ the seal
@settings(max_examples=30, deadline=None)
@given(st.text("0123456789abcdef", min_size=1, max_size=64), st.text("0123456789abcdef", min_size=1, max_size=64),
       st.text("0123456789abcdef", min_size=1, max_size=64))
def test_a_seal_vouches_only_for_its_source_and_digest(tmp_path_factory, h, digest, other):
    seal = eval_sandbox.BuildSeal(str(tmp_path_factory.mktemp("k")))
    marker = seal.seal(h, digest)
    assert seal.opened(h, marker) == digest
    assert seal.opened(h, f"{digest}\n") == ""  # unsigned
    if other != h:
        assert seal.opened(other, marker) == ""  # a marker moved from another source's build
    if other != digest:
        assert seal.opened(h, marker.replace(digest, other, 1)) == ""


def test_the_key_is_private_shared_and_replaced_when_malformed(tmp_path):
    a = eval_sandbox.BuildSeal(str(tmp_path))
    path = tmp_path / eval_sandbox.KEY_NAME
    assert os.stat(path).st_mode & 0o777 == 0o600 and os.stat(tmp_path).st_mode & 0o777 == 0o700
    assert eval_sandbox.BuildSeal(str(tmp_path)).key == a.key  # a resumed run signs with the same key
    path.write_bytes(b"short")
    assert len(eval_sandbox.BuildSeal(str(tmp_path)).key) == 32
    eval_sandbox.forget_key(str(tmp_path))
    assert not path.exists()


@pytest.mark.skipif(bool(NAMESPACE), reason=f"no namespace here: {NAMESPACE}")
def test_the_namespace_hides_the_key_directory(tmp_path):
    keys, cache = tmp_path / "keys", tmp_path / "cache"
    cache.mkdir()
    eval_sandbox.BuildSeal(str(keys))
    ns = eval_namespace.Namespace(read_only=[], writable=[str(cache)], hidden=[str(keys)])
    r = subprocess.run(ns.wrap(["/bin/sh", "-c", f"cat {keys}/{eval_sandbox.KEY_NAME}; ls -A {keys}; "
                                                 f"umount {keys} || mount -o remount,rw {keys} || echo kept"]),
                       capture_output=True, timeout=30)
    assert r.stdout.decode().split() == ["kept"], (r.stdout, r.stderr)


def test_the_key_directory_may_not_hide_the_cache(tmp_path):
    with pytest.raises(ValueError, match="key_dir"):
        ek.Evaluator(REF, device="cpu", cache_dir=str(tmp_path / "cache"), key_dir=str(tmp_path))


# ------------------------------------------------------------------- torch's precompiled header, checked once
def _fake_torch(tmp_path: Path, monkeypatch) -> Path:
    import importlib.util
    root = tmp_path / "torch"
    (root / "include" / "torch").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "version.py").write_text("__version__ = '9.9'\n")
    (root / "include" / "torch" / "extension.h.gch").write_bytes(b"gch")
    (root / "include" / "torch" / "extension.h.sign").write_text("g++_-x_c++-header")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: importlib.machinery.ModuleSpec("torch", None, origin=str(root / "__init__.py"))
                        if name == "torch" else real(name, *a))
    return root


def test_the_header_s_state_changes_with_whatever_torch_s_check_reads(tmp_path, monkeypatch):
    from evaluate_kernel.build import pch_state
    root = _fake_torch(tmp_path, monkeypatch)
    inc = root / "include" / "torch"
    env = {"PATH": "/usr/bin"}
    first = pch_state(env)
    assert first and pch_state(dict(env)) == first
    assert pch_state(dict(env, CXX="clang++")) != first
    assert pch_state(dict(env, PATH="/opt/gcc/bin")) != first
    (inc / "extension.h.sign").write_text("g++_-x_c++-header_-O3")
    signed = pch_state(env)
    assert signed != first
    os.utime(inc / "extension.h.gch", ns=(1, 1))   # rebuilt or touched
    assert pch_state(env) != signed
    touched = pch_state(env)
    (root / "version.py").write_text("__version__ = '10.0'\n")
    assert pch_state(env) != touched
    (inc / "extension.h.gch").unlink()
    assert pch_state(env) == ""


@pytest.mark.skipif(bool(NAMESPACE), reason=f"no namespace here: {NAMESPACE}")
def test_a_fresh_evaluator_skips_torch_s_header_check_while_the_header_is_as_it_last_passed(tmp_path, monkeypatch):
    """The check imports torch in a new process (seconds, ahead of a first build): it runs once, then again
    only when the header's state differs from the one it left; the state is kept where candidates cannot
    write it (the key directory, hidden by the namespace)."""
    from evaluate_kernel import builds as ev_mod
    with _evaluator(tmp_path) as ev:
        if ev.builds.prepare_pch() == "off":
            pytest.skip("torch's include directory is not writable here: no precompiled header")
        seen = tmp_path / "keys" / "pch-current"
        assert seen.exists()
        runs = []
        real_run = ev_mod.subprocess.run
        monkeypatch.setattr(ev_mod.subprocess, "run", lambda *a, **k: runs.append(a) or real_run(*a, **k))
        assert ev.builds.prepare_pch() == "ready" and runs == []
        seen.write_text("[]")   # another header than the one checked
        assert ev.builds.prepare_pch() == "ready" and len(runs) == 1
        assert seen.read_text() != "[]"


def test_a_directory_the_parent_relies_on_is_made_its_own_again(tmp_path):
    """A candidate may make, in place of a directory the parent uses, one that keeps every later worker out
    (mode 000: root without the capability that overrides modes cannot enter it), or one others may write."""
    shut = tmp_path / "tmp"
    shut.mkdir(mode=0)
    os.chmod(shut, 0)
    eval_sandbox.own_dir(str(shut))
    assert shut.stat().st_mode & 0o777 == 0o700
    open_ = tmp_path / "nv"
    open_.mkdir()
    os.chmod(open_, 0o3777)
    eval_sandbox.own_dir(str(open_))
    assert open_.stat().st_mode & 0o7777 == 0o755
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "xdg").symlink_to(target)
    eval_sandbox.own_dir(str(tmp_path / "xdg"))
    assert (tmp_path / "xdg").is_dir() and not (tmp_path / "xdg").is_symlink()
    assert target.stat().st_mode & 0o777 != 0 and list(target.iterdir()) == []


def test_a_link_put_in_place_of_the_builds_directory_mid_build_leads_nowhere(tmp_path, monkeypatch):
    """Candidates building beside an evaluation may put a link where cache/ext was at any moment: the
    parent's locks, directories and deletions go through its own descriptor of the directory, so nothing
    of ours (root) lands where the link points."""
    from evaluate_kernel import builds as eval_builds
    outside = tmp_path / "outside"
    outside.mkdir()
    real = eval_builds.own_dir
    planted = []

    def own_then_plant(path):
        real(path)
        if path.endswith("ext") and not planted:
            os.rename(path, path + "-moved")
            os.symlink(outside, path)
            planted.append(path)
    monkeypatch.setattr(eval_builds, "own_dir", own_then_plant)
    with _evaluator(tmp_path, isolate=False) as ev:
        r = ev.evaluate(HONEST_PY)
    assert planted and r.status == "ok", r.message
    assert list(outside.iterdir()) == []


@pytest.mark.slow   # two C++ builds (~10-30 s each on two cores)
@pytest.mark.skipif(bool(NAMESPACE), reason=f"no namespace here: {NAMESPACE}")
def test_a_build_directory_remade_with_no_permissions_does_not_stop_the_next_build(tmp_path):
    """A candidate may move a build's directory away and make it again with mode 000 (a mode given at
    creation is no chmod): the next evaluation of that source finds no marker and builds afresh, in a
    directory of ours, instead of a builder (root without the capability that overrides modes) failing."""
    with _evaluator(tmp_path) as ev:
        first = ev.evaluate(HONEST_CPP)
        assert first.status == "ok", first.message
        build = _build_dir(tmp_path)
        os.rename(build, str(build) + "-moved")
        os.mkdir(build, 0)
        os.chmod(build, 0)
    with _evaluator(tmp_path) as fresh:
        again = fresh.evaluate(HONEST_CPP)
    assert again.status == "ok", again.message
    assert build.stat().st_mode & 0o700 == 0o700

"""Tests for the fork server (evaluate_kernel/forkserver.py): builders and runners forked, in fresh
namespaces, from a process that has imported torch. A candidate's leftovers (environment, modules, signal
handlers, threads, files in /dev/shm, descriptors) never reach the next candidate's processes; the
parent's handle reports pids, exit codes and kills as a Popen does; the server ends with its Evaluator and
is replaced by exec where it cannot run (CPU, CI). The namespace itself, forked or not, is checked by
test_eval_trust.py::test_namespace_confines_builder_and_runner."""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

import evaluate_kernel as ek
from evaluate_kernel.forkserver import SERVE, ForkServer
from evaluate_kernel.namespace import Namespace, namespace_problem
from evaluate_kernel.protocol import Worker, _preexec

HERE = Path(__file__).parent / "candidates_cpu"
REF = (HERE / "reference_small.py").read_text()
NAMESPACE = namespace_problem()
RELU = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(64, 1024)]


def get_init_inputs():
    return []
'''
needs_namespace = pytest.mark.skipif(bool(NAMESPACE), reason=f"no namespace here: {NAMESPACE}")

LEAVE_CODE = """
import os, signal, sys, threading, time, types
os.environ["PACEVOLVE_LEFT_BEHIND"] = "1"
sys.modules["pacevolve_left_behind"] = types.ModuleType("pacevolve_left_behind")
signal.signal(signal.SIGUSR1, lambda *a: None)
threading.Thread(target=time.sleep, args=(600,), name="pacevolve-left-behind", daemon=True).start()
with open("/dev/shm/pacevolve-left-behind", "w") as f:
    f.write("1")
KEPT = os.open("/dev/null", os.O_RDONLY)   # a descriptor left open (not close-on-exec)
os.set_inheritable(KEPT, True)
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.msgget(0x7ED8, 0o1000 | 0o600)   # a SysV message queue (IPC_CREAT)
import platform
ADD_KEY = {"x86_64": 248, "aarch64": 217}[platform.machine()]
libc.syscall(ADD_KEY, b"user", b"pacevolve-left-behind", b"1", 1, -4)   # into the user's keyring
try:
    open("/dev/pacevolve-left-behind", "w").close()
except OSError:
    pass
"""
SEE_CODE = """
import json, os, signal, sys, threading
seen = {"env": "PACEVOLVE_LEFT_BEHIND" in os.environ, "module": "pacevolve_left_behind" in sys.modules,
        "handler": signal.getsignal(signal.SIGUSR1) is not signal.SIG_DFL,
        "thread": any(t.name == "pacevolve-left-behind" for t in threading.enumerate()),
        "shm": os.path.exists("/dev/shm/pacevolve-left-behind"),
        "fds": [os.readlink(f"/proc/self/fd/{fd}") for fd in range(256) if os.path.exists(f"/proc/self/fd/{fd}")],
        "pid": os.getpid(), "own_session": os.getsid(0) == os.getpid(), "dev": sorted(os.listdir("/dev")),
        "cores": [os.cpu_count(), len(os.sched_getaffinity(0))],
        "builder": os.environ.get("CUDA_VISIBLE_DEVICES") == ""}
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
seen["sysv"] = libc.msgget(0x7ED8, 0) != -1
import platform
REQUEST_KEY = {"x86_64": 249, "aarch64": 218}[platform.machine()]
seen["key"] = libc.syscall(REQUEST_KEY, b"user", b"pacevolve-left-behind", None, -4) > 0
with open(REPORT + "-" + os.urandom(4).hex(), "w") as f:
    json.dump(seen, f)
"""
# The code runs through exec of a reversed string: the screen rejects threads and such by their names,
# and this test is about what lies past it.
CANDIDATE = '''import builtins
import torch
import torch.nn as nn

builtins.exec(CODE[::-1])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x) + ZERO
'''
LEAVE = CANDIDATE.replace("CODE", repr(LEAVE_CODE[::-1])).replace("ZERO", "0")
@pytest.fixture(scope="module")
def ev(tmp_path_factory):
    root = tmp_path_factory.mktemp("forks")
    e = ek.Evaluator(RELU, device="cpu", cache_dir=str(root / "cache"), log_dir=str(root / "logs"),
                     max_pairs=8, timing_s=1.0, run_timeout_s=60, keep_worker_dirs=True)
    yield e
    e.close()


@needs_namespace
def test_what_a_candidate_leaves_behind_is_not_seen_by_the_next(ev):
    """Environment, modules, a signal handler, a thread, a file in /dev/shm or /dev, an open descriptor, a
    SysV message queue and a key in the user's keyring, left (or tried) by one candidate in its builder and
    runner, are absent from the next candidate's builder and runner, which have sessions of their own and
    count as the machine's cores the ones they were given."""
    # Wherever namespaces work, with one CPU thread, on a CPU build of torch and on a CUDA build alike
    # (whose cpp_extension starts the driver at import: the server leaves that import to its workers).
    assert ev.fork_server == "on", ev.fork_server
    first = ev.evaluate(LEAVE)
    assert first.correct, first.message
    report = f"seen-{time.monotonic_ns()}"   # in each worker's home, the one directory it writes in
    see = SEE_CODE.replace("REPORT", f'os.path.join(os.path.dirname(os.environ["TMPDIR"]), {report!r})')
    second = ev.evaluate(CANDIDATE.replace("CODE", repr(see[::-1])).replace("ZERO", "0.0"))
    assert second.correct, second.message
    seen = [json.loads(p.read_text()) for p in Path(ev.cache_dir, "w").rglob(report + "*")]
    assert len(seen) >= 2, seen   # the builder and the runner
    for s in seen:
        assert not any(s[k] for k in ("env", "module", "handler", "thread", "shm", "sysv", "key")), s
        assert s["own_session"], s
        # /dev is the namespace's own: no file the last candidate made, no root-only node of the host's
        assert set(s["dev"]) <= {"null", "zero", "full", "random", "urandom", "shm", "fd", "stdin", "stdout",
                                 "stderr"} | {n for n in s["dev"] if n.startswith("nvidia")}, s["dev"]
        assert "/dev/null" not in s["fds"] and not [f for f in s["fds"] if f.startswith("socket:")], s["fds"]
        assert s["pid"] < 100, s   # the first processes of a namespace of their own
        # the machine's core count, as glibc reads it (hardware_concurrency, ninja), is the worker's own
        assert s["cores"][0] == s["cores"][1], s
        if s["builder"]:   # no GPU, whatever its candidate code does with the environment
            assert not [n for n in s["dev"] if n.startswith("nvidia")], s["dev"]


@needs_namespace
def test_the_parent_handle_reports_pid_exit_code_and_kill(tmp_path):
    """A forked worker's pid is reported once it runs; closing its stdin ends it with code 0 (worker.main's
    answer to no work); a kill ends it with -SIGKILL, and its whole namespace with it. A server that died
    refuses further work and says so."""
    code_dir = str(Path(ek.__file__).resolve().parent.parent)
    env = ek.scrubbed_env(OMP_NUM_THREADS="1")
    server = ForkServer(env, code_dir, str(tmp_path / "forks.log"), preexec=_preexec(True, None))
    ns = Namespace(read_only=[], writable=[str(tmp_path)])
    try:
        handles = []
        for _ in range(2):
            r, w = os.pipe()
            with open(tmp_path / "worker.log", "ab") as log:
                try:
                    proc = server.spawn(env, {w: w, 1: log.fileno(), 2: log.fileno()},
                                        [code_dir, "--worker", str(w)], ns, None)
                except RuntimeError:
                    if "threads" in server.status:   # a CUDA build of torch starts a thread at import
                        pytest.skip(f"no fork server here: {server.status}")
                    raise
            os.close(w)
            handles.append((proc, r))
        quiet, killed = handles
        for proc, _ in handles:
            inner = proc.worker_pid(30)
            assert inner != proc.pid and os.path.exists(f"/proc/{inner}") and proc.poll() is None
        quiet[0].stdin.close()
        assert quiet[0].wait(timeout=30) == 0
        inner = killed[0].worker_pid(1)
        killed[0].kill()
        assert killed[0].wait(timeout=30) == -signal.SIGKILL
        deadline = time.monotonic() + 10
        while os.path.exists(f"/proc/{inner}") and _state(inner) != "Z" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not os.path.exists(f"/proc/{inner}") or _state(inner) == "Z"
        for _, r in handles:
            os.close(r)
        server.proc.kill()   # a server that dies later is said to have died, and refuses further work
        server.proc.wait()
        with pytest.raises(RuntimeError):
            server.spawn(env, {}, [code_dir, "--worker", "9"], ns, None)
        assert server.status.startswith("failed: the fork server died"), server.status
    finally:
        server.close()


def test_the_fork_server_ends_with_its_evaluator(tmp_path):
    """Closing an Evaluator ends its fork server (its only child running SERVE); where namespaces work it
    was on, elsewhere it never started."""
    before = _servers()
    e = ek.Evaluator(REF, device="cpu", cache_dir=str(tmp_path / "cache"), eager_baseline=False)
    try:
        assert e.evaluate((HERE / "honest_torch.py").read_text()).correct
        mine = {pid for pid in _servers() - before if _descends_from(pid, os.getpid())}   # not a neighbour's
        assert (e.fork_server == "on") == bool(mine), e.fork_server
    finally:
        e.close()
    deadline = time.monotonic() + 10
    while mine & _servers() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not mine & _servers()


@needs_namespace
def test_a_worker_starts_by_exec_when_the_fork_server_is_gone(tmp_path):
    """A server that died (or never started) makes no worker fail: it says why, and the worker starts by
    exec in the same namespace."""
    code_dir = str(Path(ek.__file__).resolve().parent.parent)
    env = ek.scrubbed_env(OMP_NUM_THREADS="1")
    server = ForkServer(env, code_dir, str(tmp_path / "forks.log"), preexec=_preexec(True, None))
    assert server.status == "starting"
    server.proc.kill()
    server.proc.wait()
    w = Worker(env, str(tmp_path / "worker.log"), warm=True, code_dir=code_dir,
               namespace=Namespace(read_only=[], writable=[str(tmp_path)]), forkserver=server)
    try:
        assert not w.forked and server.status.startswith("failed"), server.status
        assert w.main_pid() != w.proc.pid   # unshare's child
        w.proc.stdin.close()
        assert w.proc.wait(timeout=60) == 0
    finally:
        w.kill()


def _descends_from(pid: int, ancestor: int) -> bool:
    """Whether ancestor is pid's parent, its parent's, ... (another test process's Evaluators are not ours)."""
    while pid > 1:
        if pid == ancestor:
            return True
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
    return False


def _servers() -> set[int]:
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if SERVE.encode() in f.read():
                        found.add(int(entry))
            except OSError:
                pass
    return found


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def test_a_forked_workers_last_words_reach_its_log(tmp_path):
    """An exception that ends a forked worker is printed to its log, as the interpreter prints it for a
    worker started by exec (the fork server's child ends by os._exit, which prints and flushes nothing)."""
    broken = "import pacevolve_no_such_module\n" + REF
    with pytest.raises(RuntimeError, match="ModuleNotFoundError.*pacevolve_no_such_module"):
        ek.Evaluator(broken, device="cpu", cache_dir=str(tmp_path / "cache"))

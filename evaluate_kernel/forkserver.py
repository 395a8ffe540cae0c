"""Parent side and leaf: builders and runners forked, in fresh namespaces, from a process that has already
imported torch (a cached CPU evaluation no longer waits for a runner's `import torch`, about 1-2 s).

The fork server is a process of the evaluator's own (like the reference worker, it never runs candidate
code): started with the workers' environment from the private copy of our code, it imports torch and the
worker's modules, checks that it has no thread but its own, and then only forks. For each worker:

    server ──fork──> launcher: new session, dies with the server; unshare(PID, mount, network, IPC)
                        └──fork──> first process of the new PID namespace: dies with the launcher;
                                   /proc, the mounts and no capability (namespace.enter), the worker's
                                   descriptors, environment and directory, then worker.main()

What it guarantees, beside namespace.py's policy, which a forked worker gets exactly as one started by
unshare(1) does:
* a fresh process per worker, forked from a server that has run nothing but imports: nothing one
  candidate does reaches the next (they share no process, no namespace and no writable memory);
* the worker holds only the descriptors it is given (stdin, its log, its result pipe and input file),
  at the numbers the parent holds them by; the server's socket is closed before any worker code runs,
  so no candidate can ask the server for anything;
* the launcher reports the worker's pid and, when it ends, its exit status on a pipe only the parent
  reads: the parent's handle (ForkedProc) answers poll, wait and kill like a Popen's.

The reference worker and the GPU's prober (which never run candidate code) are forked the same way,
without the namespaces. Used only where namespaces work (without one, a forked worker could reach the
server like any process of the same user) and where the server has one thread (with cpu_threads > 1 and
more than one core, torch's import starts OpenMP's pool, which a fork does not copy): otherwise workers
start by exec, as before. The server never touches CUDA: on a CUDA build, importing
torch.utils.cpp_extension initialises the driver (its thread, cuda00001400006, seen on the H100 and H200
machines), and a process forked after that cannot use the GPU, so there the workers import it themselves.
"""
from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time

from .namespace import ABORT, Namespace

# `python -I -B -c SERVE CODE_DIR SOCKET_FD`
SERVE = "import sys; sys.path.append(sys.argv[1]); from evaluate_kernel.forkserver import serve; serve()"
_MAX_MSG = 1 << 20


class ForkServer:
    """The parent's end: started at once (its torch import overlaps other start-up), awaited at the first
    spawn(). Thread-safe; `status` is "starting", "on" or "failed: why"; close() ends the server."""

    def __init__(self, env: dict[str, str], code_dir: str, log_path: str, preexec, timeout: float = 300.0):
        self.timeout = timeout
        self._lock = threading.Lock()
        self._ready: bool | None = None
        self.ready_at: float | None = None   # time.monotonic() when its readiness was read (the first fork waits)
        self.problem = ""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._sock = ours
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-B", "-c", SERVE, code_dir, str(theirs.fileno())],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, pass_fds=(theirs.fileno(),),
                env=env, start_new_session=True, preexec_fn=preexec)
        theirs.close()

    @property
    def status(self) -> str:
        return {None: "starting", True: "on"}.get(self._ready, f"failed: {self.problem}")

    def _await_ready(self) -> bool:
        if self._ready is None:
            self._sock.settimeout(self.timeout)
            try:
                msg = json.loads(self._sock.recv(_MAX_MSG) or b"{}")
            except (OSError, ValueError) as e:
                msg = {"error": repr(e)}
            self._ready = msg.get("kind") == "ready"
            self.ready_at = time.monotonic()
            if not self._ready:
                self.problem = msg.get("error") or "no answer"
                self.close()
        return self._ready

    def spawn(self, env: dict[str, str], fds: dict[int, int], argv: list[str], namespace: Namespace | None,
              cpus: list[int] | None) -> "ForkedProc":
        """A worker running worker.main() with sys.argv[1:] = argv, holding fds (its number -> ours), in
        fresh namespaces under `namespace`'s policy; None only for a reference worker (ours, never running
        candidate code, outside any namespace)."""
        status_r, status_w = os.pipe()
        stdin_r, stdin_w = os.pipe()
        fds = {**fds, 0: stdin_r}
        order = list(dict.fromkeys(fds.values()))
        req = {"env": env, "argv": argv, "cwd": os.getcwd(), "cpus": cpus,
               "namespace": namespace.spec() if namespace is not None else None,
               "fds": {str(k): order.index(v) for k, v in fds.items()}}
        try:
            with self._lock:
                if not self._await_ready():
                    raise OSError(f"the fork server did not start: {self.problem}")
                socket.send_fds(self._sock, [json.dumps(req).encode()], [status_w] + order)
                reply = json.loads(self._sock.recv(_MAX_MSG) or b"{}")
        except (OSError, ValueError) as e:
            reply = {"error": repr(e)}
        finally:
            os.close(status_w)
            os.close(stdin_r)
        if self._ready and self.proc.poll() is not None:   # gone: said, and every later worker starts by exec
            self._ready, self.problem = False, f"the fork server died (exit {self.proc.returncode})"
        if not isinstance(reply.get("pid"), int):
            os.close(status_r)
            os.close(stdin_w)
            raise RuntimeError(f"the fork server failed: {reply.get('error') or 'no answer'}")
        return ForkedProc(reply["pid"], status_r, os.fdopen(stdin_w, "wb"))

    def close(self) -> None:
        try:
            self._sock.close()
        except OSError:
            pass
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


class ForkedProc:
    """The parent's handle on a forked worker: the launcher's pid (its process group holds the worker),
    and the pipe on which the launcher writes the namespace's first process's pid, then its exit code."""

    def __init__(self, pid: int, status_fd: int, stdin):
        self.pid, self.stdin = pid, stdin
        self.inner: int | None = None   # the worker's own pid, as this process sees it
        self.returncode: int | None = None
        self._fd, self._buf = status_fd, b""
        try:
            self._pidfd = os.pidfd_open(pid)   # signals reach the launcher, never a process that took its pid
        except OSError:
            self._pidfd = None

    def poll(self) -> int | None:
        self._read(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._read(timeout):
            raise subprocess.TimeoutExpired("forked worker", timeout)
        return self.returncode

    def worker_pid(self, timeout: float) -> int:
        while self.inner is None and self.returncode is None and self._read(timeout, until_pid=True):
            pass
        if self.inner is None:
            raise EOFError("the worker's namespace has no process")
        return self.inner

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def send_signal(self, sig: int) -> None:
        if self.returncode is not None:
            return
        try:
            if self._pidfd is not None:
                signal.pidfd_send_signal(self._pidfd, sig)
            else:
                os.kill(self.pid, sig)
        except (ProcessLookupError, OSError):
            pass

    def _read(self, timeout: float | None, until_pid: bool = False) -> bool:
        """Reads the status pipe until the exit code (or, until_pid, the pid) is known or timeout passes."""
        while self.returncode is None and not (until_pid and self.inner is not None):
            if not select.select([self._fd], [], [], timeout)[0]:
                return False
            chunk = os.read(self._fd, 4096)
            if not chunk:   # the launcher died without a word: killed
                self._done(-signal.SIGKILL)
                break
            self._buf += chunk
            while b"\n" in self._buf:
                line, self._buf = self._buf.split(b"\n", 1)
                if line[:1] == b"P" and line[1:].isdigit():
                    self.inner = int(line[1:])
                elif line[:1] == b"S":
                    self._done(int(line[1:]))
        return True

    def _done(self, code: int) -> None:
        self.returncode = code
        for fd in (self._fd, self._pidfd):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._fd = self._pidfd = None


# ------------------------------------------------------------------------------ the server's side

def serve() -> None:
    """The fork server's main (argv: CODE_DIR SOCKET_FD): import, check, then fork on request."""
    sock = socket.socket(fileno=int(sys.argv[2]))
    sys.path += [d for d in os.environ.get("PACEVOLVE_EVAL_PATH", "").split(os.pathsep) if d]
    try:
        import torch
        # cpp_extension's import initialises a CUDA build's driver (a ROCm build's may do the same): there
        # each worker imports it itself
        if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
            import torch.utils.cpp_extension  # noqa: F401
        from . import worker  # noqa: F401
        threads = len(os.listdir("/proc/self/task"))
        if threads != 1:
            raise RuntimeError(f"{threads} threads after importing torch (a fork copies one)")
    except BaseException as e:  # noqa: BLE001
        sock.send(json.dumps({"kind": "error", "error": f"{type(e).__name__}: {e}"}).encode())
        os._exit(1)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)   # launchers are reaped by the kernel
    sock.send(b'{"kind": "ready"}')
    server = os.getpid()
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(sock, _MAX_MSG, 16)
        except OSError:
            os._exit(0)
        if not msg:
            os._exit(0)   # the evaluator closed its end
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            pid = os.fork()
        except OSError as e:
            for fd in fds:
                os.close(fd)
            sock.send(json.dumps({"error": f"fork: {e}"}).encode())
            continue
        if pid == 0:
            try:
                sock.close()
                _launch(json.loads(msg), fds, server)
            finally:
                os._exit(ABORT)
        for fd in fds:
            os.close(fd)
        sock.send(json.dumps({"pid": pid}).encode())


def _launch(req: dict, fds: list[int], server: int) -> None:
    """The launcher: makes the namespaces, forks their first process, reports its pid and exit code."""
    _die_with_parent(server)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.setsid()
    status = fds[0]
    if req.get("cpus"):   # before the fork: every process of the worker starts on these cores
        try:
            os.sched_setaffinity(0, req["cpus"])
        except OSError:
            pass
    from . import namespace
    contained = req["namespace"] is not None   # else the reference worker: ours, outside any namespace
    try:
        if contained:
            namespace.unshare_now()
    except OSError as e:
        os.write(2, f"fork server: unshare failed: {e}\n".encode())
        os._exit(ABORT)
    alive_r, alive_w = os.pipe()   # read end at EOF: the launcher is gone
    sync_r, sync_w = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(alive_w)
        os.close(sync_r)
        os.close(status)
        _die_with_parent(0)
        if select.select([alive_r], [], [], 0)[0]:   # the launcher died before we asked to die with it
            os._exit(0)
        os.close(alive_r)
        os.write(sync_w, b"1")
        os.close(sync_w)
        try:
            if contained:
                namespace.mount_proc()
                namespace.enter(req["namespace"])
        except OSError as e:
            os.write(2, f"namespace set-up failed: {e}\n".encode())
            os._exit(ABORT)
        _become_worker(req, fds[1:])
    for fd in fds[1:] + [alive_r, sync_w]:
        os.close(fd)
    started = os.read(sync_r, 1)   # the child asked to die with us: only now may the parent stop it
    if started:
        os.write(status, f"P{child}\n".encode())
    _, code = os.waitpid(child, 0)
    os.write(status, f"S{os.waitstatus_to_exitcode(code)}\n".encode())
    os._exit(0)


def _become_worker(req: dict, fds: list[int]) -> None:
    """The descriptors at the parent's numbers and nothing else, the worker's environment, then its main."""
    targets = {int(k): fds[i] for k, i in req["fds"].items()}
    import fcntl
    high = 3 + max(list(targets) + fds)
    moved = {t: fcntl.fcntl(src, fcntl.F_DUPFD, high) for t, src in targets.items()}
    for t, src in moved.items():
        os.dup2(src, t, inheritable=True)
    keep = set(targets)
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass
    os.environ.clear()
    os.environ.update(req["env"])
    os.chdir(req["cwd"])
    sys.argv = ["-c"] + req["argv"]
    from .worker import main
    code = 0
    try:
        main()
    except SystemExit as e:   # as the interpreter would end it: a message goes to stderr, exit code 1
        code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - the traceback belongs in the worker's log, as under exec
        import traceback
        traceback.print_exc()
        code = 1
    for stream in (sys.stdout, sys.stderr):   # os._exit flushes nothing
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _die_with_parent(expected_parent: int) -> None:
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG
    if expected_parent and os.getppid() != expected_parent:
        os._exit(0)

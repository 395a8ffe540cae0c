"""The protocol between the evaluator (parent) and its workers, and the parent's handle on one worker.

Every worker is `python -I -B -c BOOT CODE_DIR --worker FD [warm PARENT_PID]`, run from the evaluator's
private copy of its code (worker.main()). The parent writes one JSON object per line on the worker's stdin; the worker answers on the
private pipe FD, never on stdout (which goes to the worker's log), and every answer carries the job's
nonce, so text a candidate prints cannot pose as an answer.

Message kinds (-> parent to worker on stdin; <- worker to parent on the pipe):

| role   | dir | kind / cmd     | fields                                   | meaning                                  |
|--------|-----|----------------|------------------------------------------|------------------------------------------|
| any    | ->  | role=prep      | device, gpu_lock, reference_src, ...     | runner: set up CUDA and the reference    |
| runner | <-  | ready          | marks                                    | start-up done                            |
| any    | ->  | role=build     | candidate_src, reference_src, build, ... | exec the candidate, no GPU; one ModelNew |
| build  | <-  | built          | compile_s, has_model, calls, headers     | imported, constructed; libraries built   |
| build  | <-  | compile_error  | error, compile_s                         | a load_inline call failed                |
| any    | ->  | role=precompile| command, cpus, timeout_s, memory         | a prefix's precompiled form (prefixes.py)|
| precomp| <-  | precompiled    | returncode, error, seconds               | the compiler's exit; no candidate code   |
| any    | ->  | role=run       | mode, candidate_src, trials, cpus, ...   | import the candidate, run the trials     |
| runner | <-  | outputs        | path, unmapped, relaid, marks, confined  | trial outputs saved to path              |
| runner | <-  | error/rejected | where, error                             | import, forward or timing failed         |
| runner | ->  | cmd=go (CPU,   | layout                                   | views over the input memory, n calls     |
|        |     | GPU shared)    |                                          | (GPU: allocating in its region, a sync)  |
| runner | <-  | done           | packed, geometry, strides (calls laid    | where each call's outputs lie (GPU:      |
|        |     |                | out otherwise than the first)            | offsets into its region); the parent     |
|        |     |                |                                          | stops it, they are read (readout, ref)   |
| runner | ->  | cmd=draw (GPU  | seed, n, batch                           | (the GPU's fallback, without shared      |
|        |     | fallback)      |                                          | memory) n input sets for the next batch  |
| runner | <-  | drawn          |                                          | (every step timed by the parent: clock.py|
| runner | ->  | cmd=go (GPU f.)|                                          | n calls back to back, one synchronise    |
| runner | <-  | done           |                                          |                                          |
| runner | ->  | cmd=digest     |                                          | commit to every output of the batch      |
| runner | <-  | digests        | digests (one int per call)               |                                          |
| runner | ->  | cmd=ship       | path, calls                              | the chosen calls' outputs to path        |
| runner | <-  | shipped        |                                          | (untimed; the runner is stopped after)   |
| any    | ->  | role=ref       | device, reference_src                    | start the reference worker               |
| ref    | <-  | ready          | ref_names, device facts                  | reference loaded                         |
| ref    | ->  | cmd=prepare    | items                                    | compute reference outputs ahead          |
| ref    | <-  | prepared       | count                                    |                                          |
| ref    | ->  | cmd=compare    | path, items, tolerances                  | compare saved outputs (a tensor file)    |
| ref    | <-  | compared       | results, ref_names                       | one comparison per item                  |
| ref    | ->  | cmd=timing     | cpus, arenas (CPU) or regions (GPU)      | a timing starts: fresh batches, on the   |
| ref    | <-  | timing         |                                          | runner's cores                           |
| ref    | ->  | cmd=region     | size                                     | (GPU) device memory for a runner         |
| ref    | <-  | region         | id, fd, size                             | the parent takes fd (pidfd_getfd) and    |
|        |     |                |                                          | sends it on the runner's fd channel      |
| ref    | ->  | region_taken,  | id                                       | close our descriptor; the runner is gone |
|        |     | free_region    |                                          | (unmap and release)                      |
| ref    | ->  | cmd=fill       | seed, n, target, pick (the sets to write | inputs into the runner's file or region, |
| ref    | <-  | filled         | of the n, or null: all) / layout         | or the reference runner's                |
| ref    | ->  | draw, go,      | as the runner's, draw also keep          | the reference's batch (kept: the calls   |
|        |     | digest         |                                          | of the runner's batch to be checked)     |
| ref    | ->  | cmd=check      | path, items, tolerances (GPU shared:     | outputs read (CPU), read here from both  |
| ref    | <-  | checked        | in_regions; items' offsets, geometries)  | regions (GPU), or shipped and digested   |
|        |     |                | results                                  | (GPU fallback), against the reference's  |
| ref    | ->  | cmd=pin        | cpus (or null)                           | back to its own cores after a timing     |
| ref    | <-  | pinned         |                                          |                                          |
| probe  | ->  | cmd=probe      |                                          | a trivial kernel from a context of its   |
| probe  | <-  | probed         | ms                                       | own: is the GPU idle?                    |
| build, runner | <- | end        |                                          | nothing more follows (the launcher of a  |
|        |     |                |                                          | namespace holds the channel open)        |
| ref    | ->  | cmd=quit       |                                          |                                          |

A number read from a worker is finite and within 64 bits, or null: a runner's NaN, infinity or 400-digit
integer fails the type check of its field instead of reaching the parent's arithmetic.
"""
from __future__ import annotations

import json
import math
import os
import secrets
import select
import signal
import subprocess
import sys
import time

from .common import _remove
from .namespace import Namespace
from .sandbox import MARK_ENV, kill_processes, remove_all

# -I: no script directory, user site or PYTHON* variables on the import path; the private copy's import
# directory goes after site-packages, so nothing dropped there can stand in for a library module.
BOOT = "import sys; sys.path.append(sys.argv[1]); from evaluate_kernel.worker import main; main()"


class Worker:
    """A subprocess running worker.main(): own session, scrubbed env, stdout to its own log.

    Results travel on a private pipe, never on stdout, and every message must carry the job's nonce, so text
    the candidate prints cannot pose as a result (it goes to the log only). The worker's environment
    carries a marker, so kill() finds what it started however it was started (eval_sandbox.py).
    """

    def __init__(self, env: dict[str, str], log_path: str, warm: bool = False, code_dir: str | None = None,
                 mark: str = "", namespace: Namespace | None = None, cpus: list[int] | None = None,
                 dies_with_parent: bool = False, arena: tuple[int, int] | None = None, forkserver=None,
                 fd_channel: bool = False, home: str | None = None, keep_home: bool = False):
        r, w = os.pipe()
        # (Builders and runners) The one directory it writes in, ours to remove once it is dead, unless
        # keep_home (a builder's files, which the parent moves first; kept for inspection by an option).
        self.home, self.keep_home = home, keep_home
        self.arena = arena   # (CPU runners) (fd, size) of the input file the parent made for it; it closes with us
        self.on_kill = None   # called once when it is killed (a GPU runner's region is then freed)
        self.region = None    # (GPU runners) (reference worker's start, id, size, input bytes) of its region
        self.weights = None   # (the reference's runner) (weight seed, perturbed) of the model it times
        # (GPU runners) A socket on which descriptors reach it after its start (send_fd): its region is made
        # only when an evaluation takes it. The worker's end keeps its number there. Sequenced packets, not
        # datagrams: a datagram socket can send to, and be connected to, any datagram socket file of the
        # machine's (a channel between candidates: confine.py); a connected sequenced-packet one cannot.
        self.fd_sock, self.fd_channel = None, -1
        passed = [arena[0]] if arena else []
        if fd_channel:
            import socket
            self.fd_sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            self.fd_channel = theirs.detach()
            passed.append(self.fd_channel)
        self.log_path = log_path
        self.mark = mark or f"pv{secrets.token_hex(8)}"
        self.namespace = namespace
        self._log = open(log_path, "ab")
        code_dir = code_dir or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        # -B: nothing written beside the code. In a namespace the worker cannot see our pid (it checks for 0).
        parent = 0 if namespace else os.getpid()
        args = [code_dir, "--worker", str(w)] + (["warm", str(parent)] if warm else [])
        env = dict(env, **{MARK_ENV: self.mark})
        self.proc, self.forked = None, False
        if forkserver is not None:  # forked from a process with torch imported
            fds = {w: w, 1: self._log.fileno(), 2: self._log.fileno(), **{fd: fd for fd in passed}}
            try:
                self.proc, self.forked = forkserver.spawn(env, fds, args, namespace, cpus), True
            except RuntimeError:
                self.proc = None   # started by exec below
        if self.proc is None:
            argv = [sys.executable, "-I", "-B", "-c", BOOT] + args
            self.proc = subprocess.Popen(
                namespace.wrap(argv, code_dir) if namespace else argv,
                stdin=subprocess.PIPE, stdout=self._log, stderr=subprocess.STDOUT,
                pass_fds=(w, *passed),
                env=env, start_new_session=True, preexec_fn=_preexec(warm or dies_with_parent, cpus))
        os.close(w)
        if self.fd_channel >= 0:
            os.close(self.fd_channel)   # its number stays the worker's
        self._rfd = r
        self.result_fd = r   # our end of the results' pipe, which the prober may watch (never read)
        self._buf = b""
        self.nonce = secrets.token_hex(16)
        self.prepped = False  # runners: "prep" sent
        self.ready = False  # runners: "ready" received (start-up done)

    def main_pid(self, wait_s: float = 5.0) -> int:
        """The worker's Python process (in a namespace, the child of unshare: found once unshare has made
        it and it has left unshare's code, never unshare itself, which must not be stopped or timed in its
        place; a child stopped before it asked to die with unshare would outlive it)."""
        if self.forked:   # its launcher reports it
            return self.proc.worker_pid(wait_s)
        if self.namespace is None:
            return self.proc.pid
        pid, deadline = self.proc.pid, time.monotonic() + wait_s
        while True:
            try:
                with open(f"/proc/{pid}/task/{pid}/children") as f:
                    children = [int(c) for c in f.read().split()]
            except (OSError, ValueError):  # a kernel without that file: look for our child by its parent
                children = [c for c in _pids() if _parent_of(c) == pid]
            if children and _exe(children[0]) not in ("", _exe(pid)):
                return children[0]
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise EOFError("the worker's namespace has no process")
            time.sleep(0.01)

    def send_fd(self, fd: int) -> None:
        """A descriptor, on the worker's descriptor channel (it reads it when a job says one is coming)."""
        import socket
        socket.send_fds(self.fd_sock, [b"fd"], [fd])

    def send(self, msg: dict) -> None:
        msg = dict(msg, nonce=self.nonce)
        self.proc.stdin.write((json.dumps(msg) + "\n").encode())
        self.proc.stdin.flush()

    def recv(self, timeout: float) -> dict:
        """The next message with our nonce. Raises TimeoutError or EOFError (worker gone)."""
        deadline = time.monotonic() + timeout
        while True:
            while b"\n" in self._buf:
                line, self._buf = self._buf.split(b"\n", 1)
                try:
                    msg = loads(line)
                except (ValueError, RecursionError):  # garbage or a nesting bomb on the pipe: not a message
                    continue
                if isinstance(msg, dict) and msg.get("nonce") == self.nonce:
                    return msg
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            ready, _, _ = select.select([self._rfd], [], [], min(left, 1.0))
            if ready:
                chunk = os.read(self._rfd, 1 << 20)
                if not chunk:
                    raise EOFError
                self._buf += chunk
                if len(self._buf) > 64 << 20:
                    raise EOFError  # a flood on the result pipe is not a result

    def death(self) -> str:
        try:
            rc = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return "the process stopped answering"
        if rc < 0:
            return f"the process died with signal {signal.Signals(-rc).name}"
        return f"the process exited with code {rc} before reporting a result"

    def log_tail(self, n: int = 1500) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, 2)
                f.seek(max(0, f.tell() - n))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def discard(self) -> int:
        """Kill it and delete its log (a runner or spare whose output nobody will read)."""
        strays = self.kill()
        _remove(self.log_path)
        return strays

    def kill(self) -> int:
        """Kill the worker and every process it started (found while the worker still lives, so its
        descendants are found by ancestry); returns how many such processes there were."""
        strays = kill_processes({self.proc.pid}, self.mark)
        if self.proc.poll() is None:
            if self.forked:
                self.proc.kill()  # the launcher: its namespace's first process, and so all in it, die with it
            else:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)  # the whole group: compilers, stray children
                except ProcessLookupError:
                    pass
            self.proc.wait()
        closers = [self.proc.stdin.close, self._log.close, lambda: os.close(self._rfd)]
        if self.arena is not None:
            closers.append(lambda fd=self.arena[0]: os.close(fd))
            self.arena = None
        if self.fd_sock is not None:
            closers.append(self.fd_sock.close)
        if self.on_kill is not None:
            closers.append(self.on_kill)
            self.on_kill = None
        if self.home is not None and not self.keep_home:
            closers.append(lambda home=self.home: remove_all(home))
            self.home = None
        for closer in closers:
            try:
                closer()
            except (OSError, RuntimeError):
                pass
        return strays

class LineReader:
    """Lines from stdin, read unbuffered, so "is a line waiting?" has an honest answer (select on a
    buffered stream misses lines already pulled into its buffer)."""

    def __init__(self, fd: int = 0):
        self.fd, self.buf = fd, b""

    def wait(self, timeout: float) -> bool:
        if b"\n" in self.buf:
            return True
        if select.select([self.fd], [], [], timeout)[0]:
            chunk = os.read(self.fd, 1 << 16)
            self.buf += chunk if chunk else b"\n"  # EOF reads as an empty line
        return b"\n" in self.buf

    def readline(self) -> dict:
        while not self.wait(3600):
            pass
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line) if line.strip() else {"cmd": "quit"}

def _exe(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return ""


def _pids() -> list[int]:
    return [int(e) for e in os.listdir("/proc") if e.isdigit()]


def _parent_of(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def _preexec(die_with_parent: bool, cpus: list[int] | None):
    die = _die_with_parent_preexec() if die_with_parent else None
    if die is None and not cpus:
        return None

    def run() -> None:
        if die is not None:
            die()
        if cpus:  # before exec: every process of the worker (a namespace's too) starts on these cores
            try:
                os.sched_setaffinity(0, cpus)
            except OSError:
                pass
    return run


def _die_with_parent_preexec():
    """SIGKILL when the thread that started the worker ends (the evaluator's spawner thread, or the whole
    evaluator). A runner is SIGSTOPped whenever the reference is timed; a stopped process never sees its
    pipes close, so without this a killed evaluator would leave it behind, holding memory and possibly a
    CUDA context (the reference worker too, busy, would outlive it for a while). Set between fork and
    exec, so there is no moment when a worker could be stopped without it."""
    import ctypes
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here, in the parent
    except (OSError, AttributeError):
        return None
    return lambda: prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def check_parent(parent_pid: int) -> None:
    if parent_pid and os.getppid() != parent_pid:  # the evaluator died before the child's prctl took effect
        os._exit(0)




def loads(line: bytes | str) -> object:
    """json.loads, where a number that is not finite or not within 64 bits reads as null (None), which
    fails every check of a field's type the parent makes before any arithmetic."""
    return json.loads(line, parse_int=_int64, parse_float=_finite, parse_constant=lambda _: None)


def _int64(text: str) -> int | None:
    if len(text) > 21:
        return None
    v = int(text)
    return v if -(1 << 64) < v < (1 << 64) else None


def _finite(text: str) -> float | None:
    v = float(text)
    return v if math.isfinite(v) else None

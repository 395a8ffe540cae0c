"""Parent side and leaf: the namespace a builder or runner (the processes that run candidate code) lives in.

One policy, entered two ways: `Namespace.wrap` (an argv: util-linux unshare makes the PID, mount, network
and IPC namespaces, then this module's `enter` runs as their first process and execs the worker) and the fork
server (forkserver.py: the same namespaces made by the unshare system call, then `enter`, in a process
forked from one that has already imported torch). What `enter` guarantees, or the process exits with 97
before any worker code runs (a worker never runs with less protection than the Evaluator reported):

* every file system is read-only, but the `writable` directories (the cache), a /dev/shm of the
  namespace's own (a fresh tmpfs) and the namespace's own /proc, where the kernel's knobs (/proc/sys,
  sysrq-trigger, irq, bus, fs) are read-only too: a root process could otherwise write /etc/ld.so.preload,
  a git hook, a sysctl; /dev is the namespace's own too, holding only null, zero, full, random, urandom
  and, for a runner on a GPU, the GPU's nodes (a builder's environment hides the GPU, but its candidate
  code could change that variable before CUDA starts, and use the GPU while another candidate is timed);
* the `hidden` directories (the build-marker key's, the workers' logs, the machine's lock files) are
  covered by an empty read-only tmpfs, last, so they stay hidden inside a read-only or writable one;
* the `veiled` directory (the cache) is covered by an empty read-only tmpfs too, through which only the
  directories `shown` appear, at their own paths: the finished builds (read-only) and the worker's own
  directory (writable). No two workers share a writable directory, and none sees another's: a runner
  that slept while a builder of another candidate computed its calls through a file in the shared cache
  read 10.4x against its twin's 1.0x on the CPU, and a builder that rewrote other builds' libraries after
  their digest broke every later candidate (twenty-seventh red team);
* where the kernel has Landlock, a file is opened for writing, and anything made, removed, renamed or
  linked, only under the writable directories and /dev/shm (and files of /dev, /proc and the online-CPU
  list opened for writing): a FIFO of the machine's opens for writing on a read-only mount, to a root
  worker whatever its mode, a pipe between two candidates that both open it;
* its oom_score_adj is 1000: the kernel, short of memory, kills workers before the evaluator's own
  processes (memory held by a descriptor alone shows in no process's size);
* no capability is left, and the bounding set is empty: the candidate is root without privileges, so it
  cannot remount, umount (no way under the tmpfs that hides the key), reach an inode past a mount by a
  file handle (open_by_handle_at needs CAP_DAC_READ_SEARCH), make device nodes or load modules;
* no keyring and no further namespace: add_key, request_key, keyctl, unshare, setns and a clone that
  makes a namespace fail (keyrings belong to the user, not the namespace; a user namespace of its own
  would give the candidate capabilities there, and a network namespace a loopback it could bring up);
* the process is the first of a new PID namespace, in a session of its own (everything it starts dies
  with it, and it cannot see or signal the evaluator, the reference worker or its launcher), with an IPC
  namespace of its own (no SysV or POSIX message queue or segment outlives it) and a network namespace
  whose loopback is down and cannot be brought up: no socket reaches anything, not even this machine (a
  thousand loopback TCP connections with a pacing rate keep a kernel timer each firing on the runner's
  core while it is stopped and the reference is timed there: 1.8x over the twin on a small CPU softmax);
* the machine's online CPUs, as glibc counts them (std::thread::hardware_concurrency, sysconf, ninja,
  os.cpu_count), are the cores the worker was given (`show_cpus`): an honest OpenMP kernel sized by
  hardware_concurrency() otherwise ran two spinning threads on the runner's one core, 7x slower.
"""
from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

from . import confine

ABORT = 97  # the exit code of a worker whose namespace could not be set up

# `python -I -B -c ENTER CODE_DIR SPEC ARGV...`: the namespace's first process under unshare.
ENTER = ("import sys; sys.path.append(sys.argv[1]); from evaluate_kernel.namespace import enter_and_exec; "
         "enter_and_exec(sys.argv[2], sys.argv[3:])")


@dataclass
class Namespace:
    """`read_only` directories are bind-mounted read-only (recursively, so a writable directory bound inside
    one first stays writable); `hidden` directories are covered by an empty read-only tmpfs."""
    read_only: list[str]
    writable: list[str]
    hidden: list[str] = field(default_factory=list)
    gpu: bool = True   # the GPU's device nodes in its /dev (a builder's has none)
    veiled: str | None = None   # covered by an empty read-only tmpfs, but for `shown`
    shown: list[tuple[str, bool]] = field(default_factory=list)   # (a directory inside `veiled`, writable)

    def spec(self) -> dict:
        """What enter() needs, as plain data (it travels as JSON to the namespace's first process)."""
        hidden = list(dict.fromkeys(self.hidden))
        for d in hidden:  # made if gone: a key created there later must not be visible to this worker
            os.makedirs(d, mode=0o700, exist_ok=True)
        return {"writable": [d for d in self.writable if os.path.isdir(d)],
                "read_only": [d for d in dict.fromkeys(self.read_only) if os.path.isdir(d)], "hidden": hidden,
                "gpu": self.gpu, "veiled": self.veiled,
                "shown": [[d, bool(w)] for d, w in self.shown if os.path.isdir(d)]}

    def wrap(self, argv: list[str], code_dir: str | None = None) -> list[str]:
        """argv, run as the first process of fresh namespaces under this policy. --kill-child: if unshare
        itself is killed, the namespace's first process gets SIGKILL, and with it every process in it."""
        code_dir = code_dir or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        return ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--mount", "--net", "--ipc", "--",
                sys.executable, "-I", "-B", "-c", ENTER, code_dir, json.dumps(self.spec()), *argv]


def enter_and_exec(spec_json: str, argv: list[str]) -> None:
    """The first process under unshare: the policy, then the worker's program."""
    try:
        enter(json.loads(spec_json))
    except OSError as e:
        print(f"namespace set-up failed: {e}", file=sys.stderr, flush=True)
        os._exit(ABORT)
    os.execvp(argv[0], argv)


def unshare_now() -> None:
    """(Fork server) New PID, mount, network and IPC namespaces for this process's next child (the PID
    namespace's first process), with mount events kept from the evaluator's namespace, as unshare(1) does."""
    libc = _libc()
    if libc.unshare(_CLONE_NEWNS | _CLONE_NEWPID | _CLONE_NEWNET | _CLONE_NEWIPC) != 0:
        raise OSError(ctypes.get_errno(), "unshare")


def mount_proc() -> None:
    """(Fork server, in the PID namespace's first process) mount propagation private, and a /proc of the
    new PID namespace, as unshare --mount-proc does."""
    _mount("none", "/", None, _MS_REC | _MS_PRIVATE)
    _mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NOEXEC | _MS_NODEV)


def enter(spec: dict) -> None:
    """A session of its own, the mounts of the policy, no keyring, then every capability dropped. Raises
    OSError if any step fails."""
    os.setsid()   # a signal to its process group reaches nothing outside the namespace (its launcher was there)
    keep = set()
    # What shows through the veil, held before any mount changes: a bind takes its source mount's flags,
    # and these must come from the machine's writable mount, not from a read-only bind made below.
    shown = [(os.open(d, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC), d, w)
             for d, w in spec.get("shown", [])] if spec.get("veiled") else []
    for d in spec["writable"]:
        _mount(d, d, None, _MS_BIND)
        keep.add(d)
    for d in spec["read_only"]:
        _mount(d, d, None, _MS_BIND | _MS_REC)
        _read_only(d)
    if spec.get("veiled"):
        keep.update(_veil(spec["veiled"], shown))
    for d in spec["hidden"]:
        if os.path.isdir(d):   # (one inside the veil is hidden already)
            _mount("pacevolve-hidden", d, "tmpfs", _MS_RDONLY, "size=4k,mode=0500")
    _fresh_dev(spec.get("gpu", True))
    _own_cpu_list()
    keep.add(CPU_LIST)
    writes = sorted(keep - {CPU_LIST})
    for d in ("/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus", "/proc/fs"):
        if os.path.exists(d):
            _mount(d, d, None, _MS_BIND)
            _read_only(d)
    for mp in _mount_points():
        if mp in keep or mp in ("/proc", "/dev") or mp.startswith(("/proc/", "/dev/")):
            continue
        _read_only(mp)
    # The first the kernel kills for want of memory: memory a candidate holds by a descriptor alone (an
    # unmapped memfd) shows in no process's size, and the kernel killed the reference worker instead
    # (twenty-ninth red team). Where the machine grants CAP_SYS_RESOURCE this cannot be lowered later;
    # elsewhere a candidate can lower its own, and the evaluator stores no failure during which the kernel
    # killed anything (Evaluator._checked).
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass
    _writes_only_where_it_may(writes)
    confine.refuse_namespace_calls()
    _drop_capabilities()


def _writes_only_where_it_may(writable: list[str]) -> None:
    """(Landlock, where the kernel has it.) Files are opened for writing, and anything is made, removed,
    renamed or linked, only under the writable directories (the worker's home) and /dev/shm; a file of
    /dev or /proc is opened for writing where the mounts allow, and so is the online-CPU list. The
    read-only mounts refuse writes to files already, but not to a FIFO: one of the machine's (logind's
    session references under /run, init's control FIFO) opens for writing on a read-only mount, to a root
    worker whatever its mode, and two candidates alive at the same time that open the same one have a
    pipe between them (a FIFO moved into the finished builds carried one candidate's inputs to another's
    builder: 8.7x over the twin on the CPU, twenty-eighth red team; no worker can make one since). A
    kernel without Landlock leaves the machine's FIFOs as they are. /dev/stdout and /dev/stderr do not
    open for writing (they lead to the worker's log, outside its home); descriptors 1 and 2 write as ever."""
    libc = _libc()
    abi = libc.syscall(_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))   # its version
    if abi < 1:
        return
    make = sum(1 << b for b in range(4, 13))   # REMOVE_DIR, REMOVE_FILE and every MAKE_* right
    write = _LL_WRITE_FILE | (_LL_TRUNCATE if abi >= 3 else 0)
    handled = write | make | (_LL_REFER if abi >= 2 else 0)
    attr = ctypes.c_uint64(handled)   # landlock_ruleset_attr's first field: the file system rights handled
    ruleset = libc.syscall(_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(8), ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
    try:
        rules = [(d, handled) for d in [*writable, "/dev/shm"]] + [("/dev", write), ("/proc", write), (CPU_LIST, write)]
        for path, allowed in rules:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = _PathBeneath(allowed, fd)
                if libc.syscall(_LANDLOCK_ADD_RULE, ruleset, 1, ctypes.byref(rule), 0) != 0:
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule {path}")
            finally:
                os.close(fd)
        if libc.prctl(38, 1, 0, 0, 0) != 0 or libc.syscall(_LANDLOCK_RESTRICT_SELF, ruleset, 0) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    finally:
        os.close(ruleset)


def show_cpus(cpus: list[int]) -> None:
    """(Worker, before any candidate code) the namespace's list of online CPUs becomes `cpus`, so that what
    counts the machine's cores counts the worker's. Does nothing outside a namespace of ours."""
    if CPU_LIST not in _mount_points():
        return
    try:
        with open(CPU_LIST, "w") as f:
            f.write(",".join(str(c) for c in sorted(cpus)) + "\n")
    except OSError:
        pass


def namespace_problem() -> str:
    """Empty when builder and runner can start in a namespace here; otherwise why not."""
    if not os.path.isdir("/proc") or shutil.which("unshare") is None:
        return "util-linux unshare or /proc missing"
    with tempfile.TemporaryDirectory() as d, tempfile.TemporaryDirectory() as secret:
        open(os.path.join(secret, "key"), "w").close()
        outside = os.path.join(tempfile.gettempdir(), f".pacevolve-ns-probe-{os.getpid()}")
        probe = Namespace([d], [], [secret]).wrap(
            ["/bin/sh", "-c", f"! touch {d}/x 2>/dev/null && ! touch {outside} 2>/dev/null && "
                              f"! test -e {secret}/key && test \"$$\" = 1 && "
                              "grep -q '^CapEff:[[:space:]]*0*$' /proc/self/status && "
                              "test \"$(grep -c : /proc/net/dev)\" = 1"])   # loopback only
        try:
            r = subprocess.run(probe, capture_output=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"unshare failed: {e}"
        if os.path.exists(outside):
            os.remove(outside)
        if r.returncode != 0:
            return f"unshare failed (exit {r.returncode}: {r.stderr.decode(errors='replace').strip()[:120]})"
    return ""


# ------------------------------------------------------------------------------------------ helpers

_CLONE_NEWNS, _CLONE_NEWPID, _CLONE_NEWNET, _CLONE_NEWIPC = 0x00020000, 0x20000000, 0x40000000, 0x08000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 32, 4096, 16384, 1 << 18
_MS_NOATIME, _MS_NODIRATIME, _MS_RELATIME = 1024, 2048, 1 << 21
# statvfs's flags of a mount, and the mount flags that keep them through a read-only remount (a remount
# that dropped nosuid, nodev or noexec would loosen the mount it means to tighten).
_KEPT_FLAGS = [(os.ST_NOSUID, _MS_NOSUID), (os.ST_NODEV, _MS_NODEV), (os.ST_NOEXEC, _MS_NOEXEC),
               (os.ST_NOATIME, _MS_NOATIME), (os.ST_NODIRATIME, _MS_NODIRATIME), (os.ST_RELATIME, _MS_RELATIME)]
CPU_LIST = "/sys/devices/system/cpu/online"
_DEV_NODES = ("null", "zero", "full", "random", "urandom")
_PR_CAPBSET_DROP, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 24, 47, 4
_CAP_VERSION_3 = 0x20080522


_LANDLOCK_CREATE_RULESET, _LANDLOCK_ADD_RULE, _LANDLOCK_RESTRICT_SELF = 444, 445, 446   # x86-64 and aarch64
_LL_WRITE_FILE, _LL_REFER, _LL_TRUNCATE = 1 << 1, 1 << 13, 1 << 14


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = [None if s is None else s.encode() for s in (source, target, fstype, data)]
    libc = _libc()
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    if libc.mount(enc[0], enc[1], enc[2], flags, enc[3]) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {source} on {target} (flags {flags:#x}): {os.strerror(err)}")


def _veil(root: str, shown: list[tuple[int, str, bool]]) -> list[str]:
    """An empty tmpfs over root, and through it only the directories shown ((descriptor, path under root,
    writable)), each bound at its own path; the tmpfs then read-only. Returns the writable ones."""
    _mount("pacevolve-veil", root, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755,size=64k")
    writable = []
    for fd, path, w in shown:
        if os.path.commonpath([root, path]) != root or path == root:
            raise OSError(0, f"{path} is not inside the veiled {root}")
        os.makedirs(path, exist_ok=True)
        _mount(f"/proc/self/fd/{fd}", path, None, _MS_BIND)
        os.close(fd)
        if w:
            writable.append(path)
        else:
            _read_only(path)
    _read_only(root)
    return writable


def _read_only(path: str) -> None:
    kept = 0
    try:
        have = os.statvfs(path).f_flag
        kept = sum(ms for st, ms in _KEPT_FLAGS if have & st)
    except OSError:
        pass
    _mount(None, path, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | kept)


def _fresh_dev(gpu: bool) -> None:
    """/dev of the namespace's own, read-only: the host's null, zero, full, random, urandom and (gpu) GPU
    nodes (nvidia*) bound in, a fresh tmpfs for /dev/shm, and the fd links. Nothing else of the host's
    /dev: a root candidate could make or unlink files there (a channel to the next candidate, or /dev/null
    gone for every later process) and open root-only nodes (/dev/kvm: a virtual CPU's timers need no timer
    call; /dev/kmsg, /dev/cpu_dma_latency)."""
    names = [n for n in _DEV_NODES if os.path.exists("/dev/" + n)] + sorted(
        n for n in os.listdir("/dev") if gpu and n.startswith("nvidia"))
    held = {n: os.open("/dev/" + n, os.O_PATH | os.O_NOFOLLOW) for n in names}
    _mount("pacevolve-dev", "/dev", "tmpfs", _MS_NOSUID | _MS_NOEXEC, "mode=0755,size=64k")
    for name, fd in held.items():
        path = "/dev/" + name
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            os.mkdir(path)
        else:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        _mount(f"/proc/self/fd/{fd}", path, None, _MS_BIND | _MS_REC)
        os.close(fd)
        # Read-only: the node's inode is the host's, and its times, set by utimensat, were a channel every
        # process reads (thirty-second red team); a device node reads and writes on a read-only mount.
        _read_only(path)
    os.mkdir("/dev/shm")
    _mount("pacevolve-shm", "/dev/shm", "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=1777")
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, "/dev/" + name)
    _mount(None, "/dev", None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NOEXEC, "mode=0755,size=64k")


def _own_cpu_list() -> None:
    """A writable copy of the online-CPU list over the machine's (in /dev/shm, the namespace's own), which
    show_cpus fills in once the worker knows its cores."""
    if not os.path.exists(CPU_LIST):
        return
    with open(CPU_LIST) as f:
        text = f.read()
    copy = "/dev/shm/.pacevolve-cpus-online"
    with open(copy, "w") as f:
        f.write(text)
    _mount(copy, CPU_LIST, None, _MS_BIND)


def _mount_points() -> list[str]:
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f if len(line.split()) > 4]
    return list(dict.fromkeys(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), p) for p in points))


def _drop_capabilities() -> None:
    """Empty bounding set, no ambient capabilities, and none effective, permitted or inheritable (an exec
    would clear the latter three given the empty bounding set; a forked worker never execs, so they go here)."""
    libc = _libc()
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last = int(f.read())
    for cap in range(last + 1):
        if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), f"dropping capability {cap} from the bounding set")
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    data = (_CapData * 2)()
    if libc.capset(ctypes.byref(_CapHeader(_CAP_VERSION_3, 0)), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")
    with open("/proc/self/status") as f:
        status = dict(line.split(":", 1) for line in f if ":" in line)
    if any(int(status.get(k, "1").strip(), 16) for k in ("CapEff", "CapPrm", "CapBnd", "CapAmb")):
        raise OSError(1, "capabilities remain after dropping them")

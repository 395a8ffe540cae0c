"""Worker side: a runner's processes stay on the cores the parent gave it, at the priority it was given.

The parent times a candidate by its own wall clock (evaluation.py). That clock is honest only if the
candidate cannot buy wall time with resources the reference does not get: more cores (work spread over
threads or processes on other cores) or a higher scheduling priority than the reference worker's. So,
before any candidate code runs in a runner, confine() pins every thread to the runner's cores and installs
a seccomp filter, inherited by every thread and process the candidate starts later, under which
sched_setaffinity, sched_setscheduler, sched_setparam, sched_setattr and setpriority fail with EPERM, so
do the io_uring calls (the kernel threads that serve a ring take any core and keep working after the
runner is stopped) and Linux AIO's io_setup and io_submit (reads queued before the stop complete after
it, as interrupts on the core the reference is timed on next), so do name_to_handle_at and
open_by_handle_at (a file reached by its handle lies past the namespace's read-only mounts), and so does
every system call made through another ABI (32-bit or x32 entry points that a filter keyed on 64-bit
numbers would not see). A filter cannot be removed once
installed, and the candidate's code runs only after it is in place. So do alarm, setitimer, timer_create
and timerfd_create: a timer goes on firing while the runner is stopped, as interrupts on the core the
reference is timed on next (on the CPU their cost is the reference's CPU time; on a GPU they delay its
launches: a storm of timerfds read 1.2-1.6x over the twin on conv_groupnorm). The parent also bounds the
runner's threads, each of which can hold one wake-up, and the namespace has no network (a paced TCP
socket keeps a kernel timer of its own on the core that wrote to it: sandbox.py). And socket(2) of the
AF_UNIX family fails with EPERM, on either device (a connected pair stays): a socket file of the
machine's that two candidates alive at the same time both reach is a channel between them that no
mount stops (see confine_builder); a GPU runner's driver and the compilers a runner may start were run
without one. And file locks do nothing (_lock_rules): a lock is the file's, and so a channel too.

With no_processes (the CPU, where the parent's clock is the runner's CPU time, which counts every
thread of the runner but no other process): fork, vfork, clone without CLONE_THREAD, execve and
execveat fail with EPERM too, and clone3 with ENOSYS (the C library then starts threads with clone).
Threads may start; on a GPU, processes may too (a runner that must build its own extension runs ninja),
and the parent kills any it finds and rejects the candidate (evaluation.py).

Linux on x86-64 or aarch64; elsewhere confine() returns why it did nothing (details["confined"]).
"""
from __future__ import annotations

import ctypes
import os
import platform

_SOCKET = {"x86_64": 41, "aarch64": 198}   # socket(2): refused for the AF_UNIX family
_AF_UNIX = 1
# Refused in the namespace: AF_VSOCK, which no network namespace holds (a worker reached the host's, CID 2),
# and AF_ALG, whose sockets bound to an algorithm move a counter every process reads (/proc/crypto).
_NO_FAMILIES = (40, 38)
# Calls judged by an argument: (fcntl, flock, socketpair) numbers, and fcntl's commands by what they do.
_FCNTL = {"x86_64": (72, 73, 53), "aarch64": (25, 32, 199)}
_SET_LOCKS = (6, 7, 37, 38, 1024)   # F_SETLK, F_SETLKW, F_OFD_SETLK, F_OFD_SETLKW, F_SETLEASE: done, no lock
_GET_LOCKS = (5, 36, 1025)          # F_GETLK, F_OFD_GETLK, F_GETLEASE: refused
_F_NOTIFY, _SOCK_TYPE_MASK = 1026, 0xF
_PAIR_TYPES = (1, 5)   # SOCK_STREAM, SOCK_SEQPACKET: the socketpairs allowed in the namespace (connected)
# Refused in the namespace: inotify_init (x86-64 only), inotify_init1, inotify_add_watch, fanotify_init,
# fanotify_mark, name_to_handle_at, open_by_handle_at.
_WATCHES = {"x86_64": (253, 294, 254, 300, 301, 303, 304), "aarch64": (26, 27, 262, 263, 264, 265)}
# fadvise64, madvise: the calls that push a file's pages out of the page cache (done, nothing done);
# process_madvise (refused), which does the same to a process's own mappings.
_EVICT = {"x86_64": (221, 28, 440), "aarch64": (223, 233, 440)}
_MADV_COLD, _MADV_PAGEOUT = 20, 21
_ARCH = {  # machine: (AUDIT_ARCH, seccomp syscall, always refused, process calls, clone, clone3, x32 bit)
    "x86_64": (0xC000003E, 317, (142, 144, 203, 141, 314, 425, 426, 427, 303, 304, 37, 38, 222, 283, 206, 209),
               (57, 58, 59, 322), 56, 435, 0x40000000),
    "aarch64": (0xC00000B7, 277, (118, 119, 122, 140, 274, 425, 426, 427, 264, 265, 103, 107, 85, 0, 2), (221, 281),
                220, 435, None),
}
# Always: sched_setparam, sched_setscheduler, sched_setaffinity, setpriority, sched_setattr; io_uring_setup,
# _enter, _register (its kernel workers run on any core and go on after SIGSTOP); name_to_handle_at and
# open_by_handle_at (an inode by its handle: past the namespace's read-only mounts; the namespace also
# drops the capability they need); alarm, setitimer, timer_create, timerfd_create (timers keep firing
# while the runner is stopped, as interrupts on the core the reference is timed on: on the CPU charged to
# its CPU time, on a GPU delaying its launches; aarch64 has no alarm); io_setup and io_submit (Linux AIO:
# reads queued before the stop complete after it, as interrupts on the reference's core; this kernel
# charges an interrupt to whatever runs there, and 100k 4 KB completions a second added 6% to a loop's
# CPU time: twenty-second red team). Left open, measured: readahead, posix_fadvise(WILLNEED) and
# madvise(WILLNEED) queue the same kind of reads, but queuing costs more than the completions charge:
# 200 MB of readahead cost its caller 13.4 ms of CPU and added 1.3 ms to a loop on the core the
# interrupts landed on (twenty-third red team). On the CPU also fork, vfork,
# execve, execveat (aarch64 has no fork or vfork).
_RET_ALLOW, _RET_EPERM, _RET_ENOSYS = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38  # SECCOMP_RET_ERRNO | errno
_RET_DONE = 0x00050000   # SECCOMP_RET_ERRNO with 0: the call is skipped and returns 0 (success)
_LD_W_ABS, _JEQ_K, _JGE_K, _JSET_K, _RET_K, _AND_K = 0x20, 0x15, 0x35, 0x45, 0x06, 0x54  # classic BPF opcodes
_CLONE_THREAD = 0x00010000


# Refused in the namespace (builder and runner): add_key, request_key, keyctl (the kernel's keyrings belong
# to a user, not a namespace, and every worker is root: a key one candidate added, the next read: seventh
# red team); unshare and setns (a new user namespace gave the runner every capability in it, and with a
# network namespace of its own a loopback it could bring up: paced sockets' timers again, eighth red team).
# And every call that changes a file's mode, owner or extended attributes (ACLs are one): chmod, fchmod,
# fchmodat(2), chown, fchown, lchown, fchownat, (l/f)setxattr, (l/f)removexattr, setxattrat, removexattrat.
# Workers are root without capabilities, and root owns the cache: a runner that took every permission off
# the cache's root left every later builder and runner unable to enter it (twenty-fifth red team). A new
# file or directory's mode comes with its creation; those the parent relies on it makes its own again
# (sandbox.own_dir). (GNU ld's chmod of the library it wrote is one whose failure it ignores.) And
# io_uring_setup, _enter, _register in the builder too: a ring's kernel thread polls on whichever core the
# ring names (SQ_AFF), whatever its caller's affinity, and goes on after the caller is stopped (a builder's
# spun on the runner's core at 95%: twenty-seventh red team). No compiler uses io_uring. And mknod,
# mknodat: a FIFO can be opened for writing on a read-only mount, and one a builder left in its build
# (moved into the finished builds) carried one candidate's inputs to another's builder (8.7x over the
# twin on the CPU: twenty-eighth red team). No build makes a FIFO or a device node. And inotify, and
# fcntl's F_NOTIFY: a watch on a file or directory every worker reads (torch's, the finished builds) sees
# another candidate's opens and reads, a channel between candidates alive at the same time that needs no
# write; no compiler watches files. And a socketpair but of the stream and sequenced-packet types (the
# kernel makes a raw one a datagram one: thirty-second red team): a datagram socket, though born
# connected to its pair, can send to any datagram socket file of the machine's and be connected to one
# (a stand-in for the system log's took datagrams from a builder and a runner: thirtieth red team; a
# runner's descriptor channel is a sequenced-packet pair, which cannot). And fanotify, which an unprivileged
# process may use on this kernel (6.18) to watch any file it reads, and which saw another candidate's
# reads of torch's headers: 9,001 bytes in 0.68 s from a runner being timed to another's builder, about
# 9.5 Mbit/s in a loop of its own (thirty-first red team); and name_to_handle_at, which a receiver of
# fanotify's file handles needs (refused to runners already). And posix_fadvise, and madvise's
# MADV_COLD and MADV_PAGEOUT, do nothing (and report success): they push pages of a file out of the page
# cache, which every worker shares, and another candidate sees which (mincore, or the time a read takes):
# on the development VM a page of torch's version.py read, then dropped by fadvise(DONTNEED), showed so in
# mincore. Without them a page once read stays (until the machine needs the memory): a bit once, not a
# channel one can reset. Advice may be ignored; no compiler or driver needs it taken.
_NAMESPACE_CALLS = {"x86_64": (248, 249, 250, 272, 308,
                               90, 91, 92, 93, 94, 260, 268, 452, 188, 189, 190, 197, 198, 199, 463, 466,
                               425, 426, 427, 133, 259),
                    "aarch64": (217, 218, 219, 97, 268,
                                52, 53, 54, 55, 452, 5, 6, 7, 14, 15, 16, 463, 466, 425, 426, 427, 33)}
# ... and clone with any CLONE_NEW* flag (NEWTIME, NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET).
_CLONE_NEW = 0x00000080 | 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000


class _Insn(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]


class _Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Insn))]


def confine(cpus: list[int] | None, no_processes: bool = False) -> str:
    """Pin this process's threads to cpus (if given), then lock scheduling, timers, AF_UNIX sockets and file
    locks (and, with no_processes, process creation); "" when done, else why not."""
    if cpus:
        pin_threads(cpus)
    arch = _ARCH.get(platform.machine())
    if arch is None:
        return f"not confined: seccomp filter not written for {platform.machine()}"
    audit, nr_seccomp, sched, procs, clone, clone3, x32 = arch
    return _install(nr_seccomp, filter_program(audit, sched + (procs if no_processes else ()), x32,
                                               (clone, clone3) if no_processes else None,
                                               rules=_socket_rules() + _lock_rules()))


def confine_builder(cpus: list[int] | None, locks: bool = False) -> str:
    """(A builder, before any candidate code.) Pin this process's threads to cpus, then make the calls that
    would move a thread to other cores or raise its priority (sched_setaffinity, sched_setscheduler,
    sched_setparam, sched_setattr, setpriority) do nothing and report success, for it and everything it
    starts. A builder runs candidate code while others' batches are timed (and, on a GPU, while the
    baseline is measured beside the first build): moved onto a runner's core it would slow the batches
    there (twenty-sixth red team, by reading). Compilers that pin their own threads (cicc links
    sched_setaffinity) go on as if they had. And a socket of the AF_UNIX family fails with EPERM (a
    connected pair stays; other pairs fail in the namespace): a socket file of the machine's that
    candidates alive at the same time both reach is a channel between them no mount stops, connecting
    being no write (twenty-eighth red team: a root-owned 0600 socket took messages from a builder and a
    runner); no compiler needs one, and a builder has no GPU whose driver might. Without locks (a builder
    in the namespace, where the one lock it would take, the precompiled header's, is hidden), file locks
    do nothing and report success and asking for another's fails (_lock_rules). "" when done, else why
    not."""
    if cpus:
        pin_threads(cpus)
    arch = _ARCH.get(platform.machine())
    if arch is None:
        return f"not confined: seccomp filter not written for {platform.machine()}"
    audit, nr_seccomp, sched, x32 = arch[0], arch[1], arch[2][:5], arch[6]
    return _install(nr_seccomp, filter_program(audit, sched, x32, refusal=_RET_DONE,
                                               rules=_socket_rules() + (() if locks else _lock_rules())))


def _socket_rules() -> tuple:
    """socket(AF_UNIX, ...) -> EPERM."""
    return ((_SOCKET[platform.machine()], 0, 0xFFFFFFFF, _AF_UNIX, _RET_EPERM),)


def _lock_rules() -> tuple:
    """flock and fcntl's locks and leases do nothing and report success; F_GETLK, F_OFD_GETLK and
    F_GETLEASE fail with EPERM. A lock is the file's, not a namespace's: read locks a builder set on a file
    every worker reads (torch's version.py), their ranges spelling a message, were read by another
    candidate's runner with F_GETLK, verbatim (thirtieth red team; no write, no socket, about 0.4 us a
    lock of 6-15 bytes). No runner needs a lock once its candidate runs (a spare's turn on the device is
    taken before), nor a builder in the namespace."""
    fcntl_nr, flock_nr, _ = _FCNTL[platform.machine()]
    return (((flock_nr, None, 0, 0, _RET_DONE),) + tuple((fcntl_nr, 1, 0xFFFFFFFF, c, _RET_DONE) for c in _SET_LOCKS)
            + tuple((fcntl_nr, 1, 0xFFFFFFFF, c, _RET_EPERM) for c in _GET_LOCKS))


def _install(nr_seccomp: int, insns: list[tuple[int, int, int, int]]) -> str:
    """The filter on this process and every thread it has and will have; "" when done, else why not."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS: required to install a filter unprivileged
        return f"not confined: PR_SET_NO_NEW_PRIVS failed (errno {ctypes.get_errno()})"
    prog = _Prog(len(insns), (_Insn * len(insns))(*[_Insn(*i) for i in insns]))
    # SECCOMP_SET_MODE_FILTER with SECCOMP_FILTER_FLAG_TSYNC: every existing thread (CUDA's, torch's) too;
    # and SPEC_ALLOW: kernels that mitigate speculative store bypass "by prctl and seccomp" would otherwise
    # slow every filtered process, the runner but not the reference worker it is compared with (kernels
    # before 4.17 lack the flag: the filter alone then).
    if libc.syscall(nr_seccomp, 1, 1 | 4, ctypes.byref(prog)) != 0 and libc.syscall(nr_seccomp, 1, 1,
                                                                                    ctypes.byref(prog)) != 0:
        return f"not confined: seccomp failed (errno {ctypes.get_errno()})"
    return ""


def refuse_namespace_calls() -> None:
    """(The namespace's first process, still privileged.) For this process and all it starts, builder and
    runner alike: the keyring calls, unshare, setns and a clone that makes any namespace fail with EPERM,
    clone3 with ENOSYS (its flags lie in memory a filter cannot read; the C library then uses clone), and
    so does every system call through another ABI. Raises OSError where the filter cannot be installed."""
    arch = _ARCH.get(platform.machine())
    if arch is None:
        raise OSError(0, f"no seccomp filter written for {platform.machine()}")
    audit, nr_seccomp, clone, clone3, x32 = arch[0], arch[1], arch[4], arch[5], arch[6]
    machine = platform.machine()
    fcntl_nr, _, socketpair_nr = _FCNTL[machine]
    fadvise_nr, madvise_nr, process_madvise_nr = _EVICT[machine]
    insns = filter_program(audit, _NAMESPACE_CALLS[machine] + _WATCHES[machine] + (process_madvise_nr,), x32,
                           (clone, clone3), _CLONE_NEW,
                           rules=((fcntl_nr, 1, 0xFFFFFFFF, _F_NOTIFY, _RET_EPERM),
                                  *((_SOCKET[machine], 0, 0xFFFFFFFF, f, _RET_EPERM) for f in _NO_FAMILIES),
                                  *((socketpair_nr, 1, _SOCK_TYPE_MASK, t, _RET_EPERM)
                                    for t in range(_SOCK_TYPE_MASK + 1) if t not in _PAIR_TYPES),
                                  (fadvise_nr, None, 0, 0, _RET_DONE),
                                  (madvise_nr, 2, 0xFFFFFFFF, _MADV_COLD, _RET_DONE),
                                  (madvise_nr, 2, 0xFFFFFFFF, _MADV_PAGEOUT, _RET_DONE)))
    prog = _Prog(len(insns), (_Insn * len(insns))(*[_Insn(*i) for i in insns]))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(nr_seccomp, 1, 0, ctypes.byref(prog)) != 0:   # SECCOMP_SET_MODE_FILTER
        raise OSError(ctypes.get_errno(), "seccomp (namespace calls)")


def filter_program(audit: int, blocked, x32: int | None, clones: tuple[int, int] | None = None,
                   clone_refused: int | None = None, refusal: int = _RET_EPERM,
                   rules=()) -> list[tuple[int, int, int, int]]:
    """The classic-BPF program (code, jt, jf, k): another ABI -> EPERM; x32 numbers -> EPERM; each blocked
    number -> EPERM (or `refusal`); each rule (number, argument, mask, value, action): the call with
    (argument & mask) == value -> action (argument None: the call, whatever its arguments); with
    clones = (clone, clone3): clone3 -> ENOSYS, and clone -> EPERM when its flags
    (the first argument) hold any bit of clone_refused, or (clone_refused None) lack CLONE_THREAD;
    anything else is allowed. seccomp_data: nr at offset 0, arch at 4, argument i's low word at 16 + 8i."""
    prog = [(_LD_W_ABS, 0, 0, 4), (_JEQ_K, 1, 0, audit), (_RET_K, 0, 0, _RET_EPERM), (_LD_W_ABS, 0, 0, 0)]
    if x32 is not None:
        prog += [(_JGE_K, 0, 1, x32), (_RET_K, 0, 0, _RET_EPERM)]
    for nr in sorted(blocked):
        prog += [(_JEQ_K, 0, 1, nr), (_RET_K, 0, 0, refusal)]
    for nr, arg, mask, value, action in rules:
        if arg is None:
            prog += [(_JEQ_K, 0, 1, nr), (_RET_K, 0, 0, action)]
            continue
        # The argument is loaded over the number, which is loaded again after (the next rule's comparison).
        body = [(_LD_W_ABS, 0, 0, 16 + 8 * arg)] + ([(_AND_K, 0, 0, mask)] if mask != 0xFFFFFFFF else [])
        body += [(_JEQ_K, 0, 1, value), (_RET_K, 0, 0, action), (_LD_W_ABS, 0, 0, 0)]
        prog += [(_JEQ_K, 0, len(body), nr)] + body
    if clones is not None:
        clone, clone3 = clones
        prog += [(_JEQ_K, 0, 1, clone3), (_RET_K, 0, 0, _RET_ENOSYS)]
        if clone_refused is None:   # a thread, or nothing
            prog += [(_JEQ_K, 0, 3, clone), (_LD_W_ABS, 0, 0, 16), (_JSET_K, 1, 0, _CLONE_THREAD),
                     (_RET_K, 0, 0, _RET_EPERM)]
        else:                       # anything but a new namespace
            prog += [(_JEQ_K, 0, 3, clone), (_LD_W_ABS, 0, 0, 16), (_JSET_K, 0, 1, clone_refused),
                     (_RET_K, 0, 0, _RET_EPERM)]
    return prog + [(_RET_K, 0, 0, _RET_ALLOW)]


def pin_threads(cpus: list[int]) -> None:
    """Every thread of this process onto cpus (each thread has its own affinity; new ones inherit it)."""
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cpus)
        except OSError:
            pass

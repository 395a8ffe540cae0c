"""Parent side: a worker process stopped and let go, and its CPU time read while it is stopped.

The CPU's clock (clock.py): a batch is the CPU time a runner spends from being let go to being stopped
again, every thread counted, read from the kernel with the process stopped, so that no thread's last
milliseconds are missing from the reading.
"""
from __future__ import annotations

import os
import signal
import time


def cpu_seconds(pid: int, stopped: bool = False) -> float:
    """A process's CPU time, all its threads (those that ended too), from the kernel (Linux's CPU clock of
    another process, clock id ((~pid) << 3) | 2), read while the process is stopped. Linux brings a
    running thread's time up to date only at its scheduler's events (a tick: 1 to 10 ms apart), so a
    process read while it runs shows up to a tick per running thread too little: a runner that answered
    and kept running past the reading would carry its last milliseconds of work out of the step. Stopped
    (every thread descheduled), its time is whole; it goes on at once, unless it was `stopped` already
    (and stays so)."""
    if stopped:
        try:
            return time.clock_gettime_ns(((~pid) << 3) | 2) / 1e9
        except OSError:
            raise EOFError(f"process {pid} is gone") from None
    try:
        os.kill(pid, signal.SIGSTOP)
    except ProcessLookupError:
        raise EOFError(f"process {pid} is gone") from None
    try:
        end = time.monotonic() + 0.5
        while not all_stopped(pid) and time.monotonic() < end:
            time.sleep(0.00005)
        return time.clock_gettime_ns(((~pid) << 3) | 2) / 1e9
    except OSError:
        raise EOFError(f"process {pid} is gone") from None
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def stop(pid: int, signal_sent: bool = False, wait_s: float = 1.0) -> bool:
    """SIGSTOP pid (unless sent already), and wait until every thread of it has stopped; whether they all
    did within wait_s. (A thread inside a system call that holds off the stop, in state D, goes on
    running until the call returns.)"""
    if not signal_sent and state(pid) not in ("T", "t"):
        os.kill(pid, signal.SIGSTOP)
    end = time.monotonic() + wait_s
    while not all_stopped(pid):
        if time.monotonic() >= end:
            return False
        time.sleep(0.00002)   # a GPU batch's clock runs until here (steps.Steps._let_go): a short poll
    return True


def all_stopped(pid: int) -> bool:
    """Every thread of pid stopped (or gone)."""
    return not running_states(pid)


def running_states(pid: int) -> list[str]:
    """The states of pid's threads that have not stopped (R, S, D ...)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    return [st for st in (state(pid, tid) for tid in tids) if st not in ("T", "t", "X", "Z", "")]


def state(pid: int, tid: str | None = None) -> str:
    try:
        with open(f"/proc/{pid}/task/{tid}/stat" if tid else f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        return ""

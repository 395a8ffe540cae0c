"""How a run stops on a signal: SIGINT (Ctrl-C) and SIGTERM (`kill`, a job scheduler, `timeout`) become a
stop request that every thread sees at once, and KeyboardInterrupt in the main thread.

    stop = StopRequest()
    with stop.installed():       # the main thread's handlers; the previous ones come back afterwards
        ...                      # KeyboardInterrupt is raised here on the first signal
    stop.requested()             # any thread: True from the moment the signal arrived
    stop.exit_code, stop.what    # 130, "interrupted (Ctrl-C)"  or  143, "terminated (SIGTERM)"
    exit_after(stop, close, advice)   # close(), one line, exit 130/143

Why a flag beside the exception: only the main thread gets KeyboardInterrupt, while the islands' worker
threads go on. An evaluation they finish after the signal may be a casualty of it (Ctrl-C reaches the
evaluator's worker processes too, being sent to the whole process group, and closing the evaluator stops
the evaluations in flight), so what it returns is no verdict about the candidate and must not be stored.
Python runs a signal's handler only once the main thread holds the GIL, which a busy worker thread can
delay; the C-level handler writes a byte to the wake-up pipe at once, so `requested()` is already true
then. Before even that, from the moment the signal is sent, the kernel lists it as pending for this process
(/proc/self/status), and `requested()` reads that too: a worker thread that sees its evaluation's process
killed by the same Ctrl-C can run before the main thread is scheduled to take the signal. A second signal
while the run closes ends the process at once: everything is on disk already.
"""
from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import threading
import time

EXIT_INTERRUPTED = 130   # 128 + SIGINT, what a shell reports for Ctrl-C
EXIT_TERMINATED = 143    # 128 + SIGTERM


class StopRequest:
    """SIGINT/SIGTERM as a flag every thread can read and one KeyboardInterrupt in the main thread."""

    def __init__(self):
        self.signum: int | None = None
        self.closing = False   # the run is already stopping: a first signal now only records itself
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._pipe: tuple[int, int] | None = None

    @property
    def exit_code(self) -> int:
        return EXIT_TERMINATED if self.signum == signal.SIGTERM else EXIT_INTERRUPTED

    @property
    def what(self) -> str:
        return "terminated (SIGTERM)" if self.signum == signal.SIGTERM else "interrupted (Ctrl-C)"

    def requested(self) -> bool:
        if self._event.is_set():
            return True
        with self._lock:   # one reader at a time: the bytes read are gone for the others
            pipe = self._pipe
            if pipe and select.select([pipe[0]], [], [], 0)[0]:
                try:   # the numbers of the signals caught so far: another handler's signal is no stop
                    if {signal.SIGINT, signal.SIGTERM} & set(os.read(pipe[0], 512)):
                        self._event.set()
                except OSError:   # nothing left to read
                    pass
            if pipe and _pending(signal.SIGINT, signal.SIGTERM):
                self._event.set()
            return self._event.is_set()

    @contextlib.contextmanager
    def installed(self):
        """Handle SIGINT and SIGTERM while the block runs (main thread only; elsewhere a no-op)."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        read, write = os.pipe()
        os.set_blocking(read, False)
        os.set_blocking(write, False)
        self._pipe = (read, write)
        old_fd = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        try:
            self.install()
            yield self
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler if handler is not None else signal.SIG_DFL)
            signal.set_wakeup_fd(old_fd)
            with self._lock:
                self._pipe = None
                os.close(read)
                os.close(write)

    def install(self) -> None:
        """(Re)install the handlers: a library may have replaced them (Ray's ray.init sets one for
        SIGTERM that exits at once)."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, self._handle)
            signal.signal(signal.SIGTERM, self._handle)

    def interrupt(self) -> None:
        """Raise KeyboardInterrupt in the main thread for a stop seen through the flag: the signal's own
        handler normally does it at once; if it has not run within 2 s, raise it here."""
        deadline = time.monotonic() + 2.0
        while self.signum is None and time.monotonic() < deadline:
            time.sleep(0.05)   # the pending handler runs (and raises) here
        raise KeyboardInterrupt

    def _handle(self, signum, frame) -> None:
        if self.signum is not None:   # a second signal: the user insists; nothing on disk is half-written
            os.write(2, f"run.py: {self.what} again; stopping now\n".encode())
            os._exit(self.exit_code)
        self.signum = signum
        self._event.set()
        if not self.closing:
            raise KeyboardInterrupt


def exit_after(stop: StopRequest, close, advice: str):
    """End the process after a stop: `close()` (best effort: it must not hide the stop), one line with
    `advice`, exit 130 or 143. Worker threads may still sit in an LLM call; everything that matters is on
    disk, so the process ends without waiting for them."""
    stop.closing = True   # a signal from now on no longer raises; a second one ends the process at once
    try:
        close()
    except Exception:
        pass
    print(f"run.py: {stop.what}; {advice}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(stop.exit_code)


def quiet_until_installed() -> None:
    """Until a StopRequest is installed, SIGINT or SIGTERM ends the process with one line instead of a
    traceback from whatever module was loading (run.py calls this before its other imports): nothing has
    been made or changed yet."""
    def handle(signum, frame):
        what = "terminated (SIGTERM)" if signum == signal.SIGTERM else "interrupted (Ctrl-C)"
        os.write(2, f"run.py: {what} during set-up; nothing was made or changed\n".encode())
        os._exit(EXIT_TERMINATED if signum == signal.SIGTERM else EXIT_INTERRUPTED)
    signal.signal(signal.SIGINT, handle)
    signal.signal(signal.SIGTERM, handle)


def _pending(*signums: int) -> bool:
    """Whether one of `signums` was sent to this process and not yet taken by a thread (Linux)."""
    try:
        with open("/proc/self/status") as f:
            masks = [int(line.split()[1], 16) for line in f if line.startswith(("ShdPnd:", "SigPnd:"))]
    except (OSError, ValueError, IndexError):
        return False
    wanted = sum(1 << (s - 1) for s in signums)
    return any(m & wanted for m in masks)

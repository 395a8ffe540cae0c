"""A fast stand-in for evaluate_kernel.Evaluator that breaks, when a run is stopped under it, the way the real
one did: so run.py's handling of stops can be tested in seconds, many times over.

Each evaluation runs three phases (build, trials, timing), each a real `sleep` process in the caller's process
group, as the real evaluator's workers are. The verdict is a pure function of the source text (so every run
gets the same one), except when the evaluation is cut short:
- a phase's process killed by a signal (Ctrl-C reaches the whole process group): a false "runtime_error"
  verdict naming the signal, or for some sources a RuntimeError, as the real evaluator's worker deaths gave;
- close() while an evaluation is in flight (a run tearing down): a false "rejected" tamper verdict, as the
  real evaluator gave when its private code copy was removed under a running candidate.
`hooks(phase)` is called as each phase starts, so a test can stop the run at a chosen moment.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
import signal
import subprocess
import threading
from dataclasses import dataclass, field

PHASES = ("build", "trials", "timing")


@dataclass
class Result:
    status: str
    runtime_ms: float | None = None
    baseline_ms: float | None = None
    speedup: float | None = None
    message: str = ""
    details: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class _Opts:
    cpu_threads: int = 1


def verdict(src: str, baseline_ms: float = 1.0) -> Result:
    """The honest verdict on `src`: mostly correct with a runtime of 0.5-1.5 ms, else one failure kind;
    a source containing NONFINITE gets status ok with a NaN runtime (an evaluator bug run.py must survive)."""
    h = int(hashlib.sha256(src.encode()).hexdigest(), 16)
    if "NONFINITE" in src:
        return Result("ok", math.nan, baseline_ms, math.nan, "ok: nan", {"check_s": 0.0, "time_s": 0.0})
    kind = h % 10
    if kind < 6:
        ms = 0.5 + (h >> 8) % 1000 / 1000
        return Result("ok", ms, baseline_ms, baseline_ms / ms, f"ok: {baseline_ms / ms:.3f}x",
                      {"check_s": 0.01, "time_s": 0.02})
    if kind < 8:
        return Result("incorrect", message="incorrect on trial 0 (inputs: own): output 0: worst at index "
                      "[1, 0, 2, 3]: got 2.5, expected 2.25 (abs err 0.25)")
    if kind < 9:
        return Result("runtime_error", message="forward: RuntimeError: shape mismatch [candidate line 9 in "
                      "forward: return x.view(3, -1)]")
    return Result("compile_error", message="main.cpp:3:1: error: expected ';' before '}' token")


class FakeEvaluator:
    def __init__(self, baseline_ms: float = 1.0, phase_s: float = 0.03, hooks=None):
        self._baseline, self.phase_s, self.hooks = baseline_ms, phase_s, hooks or (lambda phase: None)
        self.opts = _Opts()
        self.closed = False
        self._procs: set[subprocess.Popen] = set()
        self._lock = threading.Lock()
        self.evaluations = 0

    def baseline_ms(self, gpu=None) -> float:
        return self._baseline

    def baseline_info(self, gpu=None) -> dict:
        return {"median_ms": self._baseline}

    def device_info(self, gpu=None) -> dict:
        return {"device_name": "fake CPU"}

    def evaluate(self, src: str) -> Result:
        self.evaluations += 1
        h = int(hashlib.sha256(src.encode()).hexdigest(), 16)
        for phase in PHASES:
            self.hooks(phase)
            code = self._run_phase()
            if self.closed:   # torn down under us: the real evaluator saw its code copy vanish
                return Result("rejected", message="rejected: the evaluator's private copy of its code was "
                              "modified (restored) while this candidate ran")
            if code is not None and code < 0:
                if h % 3 == 0:
                    raise RuntimeError(f"{phase} worker died with {signal.Signals(-code).name}")
                return Result("runtime_error", message=f"{phase}: the process died with signal "
                              f"{signal.Signals(-code).name}")
        return verdict(src, self._baseline)

    def _run_phase(self) -> int | None:
        with self._lock:
            if self.closed:
                return None
            proc = subprocess.Popen(["sleep", str(self.phase_s)])
            self._procs.add(proc)
        try:
            return proc.wait()
        finally:
            with self._lock:
                self._procs.discard(proc)

    def close(self) -> None:
        with self._lock:
            self.closed = True
            for proc in self._procs:
                proc.kill()

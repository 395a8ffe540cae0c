"""A search's evaluations: each program measured once, and only verdicts kept.

    evals = Evaluations(evaluator, rundir, context(reference_src, device, cfg), s0, stop)
    pid, result = evals.candidate(src)   # what HCM's evaluation callback (run.Search._execute) measures
    result = evals.again(pid, tag)       # one more measurement of a program, for a head-to-head
    score(result, s0)                    # the runtime at the run's reference conditions

What it guarantees, for every island's thread at once:
- A source is evaluated once per run. Its result is stored in the run directory the moment it finishes,
  under a key of the source and the evaluation's context (reference, device, TF32, tolerances), and islands
  asking for the same source at the same time share one evaluation. A head-to-head's re-measurement is
  stored under its own key (the context and its tag): a resume re-reads it and measures nothing twice.
- Only verdicts about a program are stored. An exception is the evaluator's own failure: it is recorded
  (`error`, an event) and the run stops after its round. An evaluation that ends after a stop was asked for
  (Ctrl-C, SIGTERM, or the search closing: its workers may have been killed under it) is dropped and counted
  in `discarded`, and runs again on resume; a failure waits STOP_SETTLE_S for a stop to show first. An "ok" whose runtime is no finite, positive number is returned
  (HCM records it as not scored) but never stored.
- The figures the report and the checkpoint carry: seconds spent checking and timing, results per status,
  the drift of the reference timed beside each candidate, the evaluations spent re-measuring.
"""
from __future__ import annotations

import json
import math
import threading
import time

from driver import ranking, stopping
from driver.rundir import RunDir


# A failure may be a stop signal's casualty that the stop request does not show yet: the kernel hands the
# signal to one thread, and only its handler then marks the request, while the same signal can already
# have killed the evaluation's worker and woken the thread that waits for it. A failure waits this long
# before it is judged a verdict (without it, the test of twenty stops stored "the process died with signal
# SIGINT" once in seven runs of the suite).
STOP_SETTLE_S = 0.05


class Evaluations:
    """The evaluations of one search (module docstring)."""

    def __init__(self, evaluator, rundir: RunDir, context: str, s0: float, stop: stopping.StopRequest):
        self.evaluator, self.rundir, self.context, self.s0, self.stop = evaluator, rundir, context, s0, stop
        self.closed = threading.Event()    # the search has ended: nothing that finishes now is a verdict
        self.lock = threading.Lock()
        self.seconds = 0.0                 # checking and timing, over the evaluations made in this run
        self.counts: dict[str, int] = {}   # results per status
        self.drifts: list[float] = []      # per evaluation: the reference timed beside it / s_0's measurement - 1
        self.remeasured = 0                # evaluations spent on head-to-heads
        self.discarded = 0                 # dropped after a stop request (their round is never checkpointed)
        self.error: str | None = None      # the evaluator itself broke (not a program): the run stops
        self._inflight: dict[str, threading.Event] = {}

    def candidate(self, src: str) -> tuple[str, dict]:
        """A candidate's program id and result: the stored one, else evaluated now and stored as it finishes.
        Raises EvaluationDiscarded after a stop request, and the evaluator's own exception (`error` set)."""
        pid = self.rundir.save_program(src)
        key = self.rundir.eval_key(self.context, src)
        while True:
            with self.lock:
                cached = self.rundir.load_eval(key)
                if cached is not None:
                    break
                waiter = self._inflight.get(key)
                if waiter is None:
                    self._inflight[key] = threading.Event()
                    break
            waiter.wait()   # another island is evaluating the same source right now
        if cached is not None:
            self.rundir.event("evaluation", program=pid, status=cached["status"], cached=True,
                              runtime_ms=score(cached, self.s0), **ranking.measured(cached))
            return pid, cached
        try:
            result = self._verdict(pid, key, src)   # stored before any waiter wakes up
        finally:
            with self.lock:
                self._inflight.pop(key).set()
        d = result.get("details") or {}
        with self.lock:
            self.seconds += float(d.get("check_s") or 0) + float(d.get("time_s") or 0)
            self.counts[result["status"]] = self.counts.get(result["status"], 0) + 1
            if isinstance(d.get("baseline_drift"), (int, float)):
                self.drifts.append(round(d["baseline_drift"], 5))
        self.rundir.event("evaluation", program=pid, status=result["status"], runtime_ms=score(result, self.s0),
                          **ranking.measured(result), message=result.get("message", "")[:500])
        return pid, result

    def again(self, pid: str, tag: str) -> dict:
        """One more evaluation of a stored program, under its own key. After a stop request the run stops here
        (KeyboardInterrupt); an evaluator that fails ends the head-to-head (HeadToHeadAborted, `error` set)."""
        src = self.rundir.program(pid)
        key = self.rundir.eval_key(self.context + "\0" + tag, src)
        result = self.rundir.load_eval(key)
        if result is None:
            try:
                result = self.evaluator.evaluate(src).to_dict()
            except Exception as exc:   # the evaluator's failure, not the program's: the run stops after this round
                if self._stopping(settle=True):
                    self.stop.interrupt()
                self.error = _one_line(exc)
                self.rundir.event("remeasure", program=pid, tag=tag, status="no_verdict", failed="evaluator",
                                  message=self.error)
                raise HeadToHeadAborted(self.error) from None
            if self._stopping(settle=result.get("status") != "ok"):   # the signal may have killed its workers
                self.stop.interrupt()
            result["remeasured_program"] = pid   # not "program_id": it is no candidate's first evaluation
            self.rundir.store_eval(key, result)
            d = result.get("details") or {}
            self.seconds += float(d.get("check_s") or 0) + float(d.get("time_s") or 0)
        self.remeasured += 1   # stored ones too: the count is the search's, the same after a resume
        self.rundir.event("remeasure", program=pid, tag=tag, status=result["status"],
                          message=result.get("message", "")[:300], **ranking.measured(result))
        return result

    def _verdict(self, pid: str, key: str, src: str) -> dict:
        """The evaluator's verdict on `src`, stored; no verdict (an exception, or an evaluation that ended
        after a stop was asked for) raises and stores nothing."""
        try:
            result = self.evaluator.evaluate(src).to_dict()
        except Exception as exc:   # a candidate's failure is a status; an exception is the evaluator's
            if self._stopping(settle=True):
                raise self._discard(pid) from None
            self.error = _one_line(exc)
            self.rundir.event("evaluation", program=pid, status="no_verdict", failed="evaluator",
                              message=self.error)
            raise
        result["program_id"] = pid
        if result["status"] != "ok" and self._stopping(settle=True):   # before the lock: others store meanwhile
            raise self._discard(pid)
        with self.lock:
            if self._stopping():   # the signal may have killed its workers, or close() stopped it
                raise self._discard(pid)
            if result["status"] == "ok" and score(result, self.s0) is None:
                return result   # a runtime that is no number: not a verdict to keep
            if result["status"] != "ok":
                result["failed"] = "candidate"   # every stored failure is the candidate's
            self.rundir.store_eval(key, result)
        return result

    def _stopping(self, settle: bool = False) -> bool:
        """A stop was asked for; with settle (a failure), also one that arrives within STOP_SETTLE_S."""
        if self.closed.is_set() or self.stop.requested():
            return True
        if settle:
            time.sleep(STOP_SETTLE_S)
            return self.closed.is_set() or self.stop.requested()
        return False

    def _discard(self, pid: str) -> Exception:
        self.discarded += 1
        return EvaluationDiscarded(f"the evaluation of {pid} ended after the run was asked to stop; "
                                   "it was not stored and runs again on resume")


class EvaluationDiscarded(Exception):
    """An evaluation that ended after the run was asked to stop: no verdict, never stored."""


class HeadToHeadAborted(Exception):
    """The evaluator failed during a head-to-head: it decides nothing (the run stops after the round)."""


def score(r: dict, s0: float) -> float | None:
    """The runtime at the run's reference conditions: s_0 / speedup, where the speedup comes from the
    reference timed beside the candidate (the machine's load between now and the start cancels out); the
    candidate's own runtime where the result has no speedup; None for a failure or a runtime that is no
    finite, positive number."""
    if r["status"] != "ok" or not positive(r.get("runtime_ms")):
        return None
    speedup = r.get("speedup")
    if speedup is None:
        return r["runtime_ms"]
    return s0 / speedup if positive(speedup) and positive(s0 / speedup) else None


def context(reference_src: str, device: str, cfg) -> str:
    """What a result depends on besides the program, part of every evaluation's key: the reference, the
    device, TF32, and the tolerances given as options (results judged under them are kept apart)."""
    given = [(n, getattr(cfg, n)) for n in ("rtol", "atol", "l2_tol") if getattr(cfg, n) is not None]
    return "\0".join([reference_src, device, str(cfg.allow_tf32)] + ([json.dumps(given)] if given else []))


def positive(x) -> bool:
    """A usable runtime or score: a finite number above zero (NaN, inf, 0 and None are not)."""
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def _one_line(exc: Exception) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"

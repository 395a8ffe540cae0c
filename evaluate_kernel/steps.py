"""Parent side: one batch of either side, step by step: the runner let go, stopped again, its claim checked.

A runner runs only inside its steps. Each step is sent while it is stopped, then it is let go (SIGCONT)
and stopped again the moment it answers (_let_go): on the CPU the step's time is its CPU time, read while
it is stopped; on a GPU this process's clock from the let-go until every thread has stopped, the device
then drained (drains.py).

    _host_ref_batch / _host_cand_batch   (CPU; GPU with shared memory) the reference worker fills the
                                         runner's memory while it is stopped; one step runs the calls;
                                         the claim of where the outputs lie is checked (readout.claim)
    _fitting_cand_batch                  the candidate's, again with fewer calls where its outputs outgrew
                                         its region
    _ref_batch / _cand_batch             (GPU fallback) draw, go, digest in the runner and in the reference
                                         worker, every step clocked here (batches.py)
    _weigh_reference                     the reference's runner given this evaluation's weights, untimed

Steps is a part of Timing (timing.py), kept apart only to be read apart.
"""
from __future__ import annotations

import math
import os
import secrets
import signal
import time

from . import clock, readout
from .common import EvalResult
from .drains import Drains
from .protocol import Worker
from .stopped import cpu_seconds, running_states, stop
from .verdict import forged as _forged, not_stopped as _not_stopped

HOST_LOOP_STEPS = 3000   # a fixed loop of Python, about 0.1 ms on an H100's host (host_loop)


def host_loop(cpus: list[int]) -> float | None:
    """Seconds this thread takes for a fixed loop of Python on these cores, the best of three (the first
    pays for moving here and for cold caches); None where it cannot be moved there. It tells the host's
    slow spells (76-97 us in fast ones on an H100's virtual machine, 115-230 us in slow ones), which
    decide a launch-bound call's time (DESIGN.md, "The host's slow spells")."""
    try:
        own = os.sched_getaffinity(0)   # pid 0: this thread only
        os.sched_setaffinity(0, cpus)
    except (AttributeError, OSError):
        return None
    try:
        best = math.inf
        for _ in range(3):
            t = time.perf_counter()
            total = 0
            for k in range(HOST_LOOP_STEPS):
                total += k
            best = min(best, time.perf_counter() - t)
        return best
    finally:
        os.sched_setaffinity(0, own)




class Steps(Drains):
    """The batches of a Timing (its runner self.w, device self.dev, options, details)."""

    def _time_host(self, b: clock.Batch) -> None:
        """(GPU with shared memory) The parent's fixed loop on the runners' cores, right before batch b, both
        runners stopped: a diagnostic of the host's slow spells (clock.host_note); every loop the device
        has timed sets its steady time."""
        if self.cpus:
            b.host = host_loop(self.cpus)
            if b.host is not None:
                self.dev.host_loops.append(b.host)

    def _clock(self, pid: int):
        """What a batch's steps are timed by: this process's clock on a GPU; on the CPU the worker's own CPU
        time (every thread), which a busy neighbour taking the core does not inflate."""
        if self.ev.device == "cuda":
            return time.monotonic
        return lambda: cpu_seconds(pid)

    def _ref_batch(self, seed: int, n: int, batch: int, keep: dict | None) -> clock.Batch:
        b = clock.Batch("ref", n)
        call, now = self.dev.ref_call, self._clock(self.dev.ref.main_pid())
        t = now()
        self._expect(call({"cmd": "draw", "seed": seed, "n": n, "batch": batch, "keep": keep}), "drawn")
        t = self._lap(b, "draw", t, now)
        self._expect(call({"cmd": "go"}), "done")
        t = self._lap(b, "calls", t, now)
        if self.ev.device == "cuda":
            self._drain(b, "settle")
            t = now()
        self._expect(call({"cmd": "digest"}), "digests")
        self._lap(b, "digest", t, now)
        if self.ev.device == "cuda":
            self._drain(b, "probe")
        return b

    def _cand_batch(self, seed: int, n: int, batch: int):
        """One batch of the runner's: (Batch, the digests it committed to) or (a rejection, None)."""
        b = clock.Batch("cand", n)
        self._thaw()
        now = self._clock(self.main)
        t = now()
        self.w.send({"cmd": "draw", "seed": seed, "n": n, "batch": batch})
        self._reply("drawn")
        t = self._lap(b, "draw", t, now)
        self.w.send({"cmd": "go"})
        self._reply("done")
        t = self._lap(b, "calls", t, now)
        if self.ev.device == "cuda":   # work still running on any stream after "done" is the calls'
            bad = self._drain(b, "settle")
            if bad is not None:
                return bad, None
            t = now()
        self.w.send({"cmd": "digest"})
        msg = self._reply("digests")
        self._lap(b, "digest", t, now)
        values = msg.get("digests")
        if not isinstance(values, list) or len(values) != n or not all(type(v) is int for v in values):
            return _forged(self.details, "the runner sent digests for another number of calls than it made"), None
        return b, values

    def _weigh_reference(self) -> None:
        """Give the reference's runner this evaluation's weights (timed_weights), untimed, before its first
        batch; it is stopped again after. Its failure is the reference's, as a batch's."""
        rr, want = self.rr, (self.timed_weights["weight_seed"], self.timed_weights["perturb"])
        if rr.weights == want:
            return
        try:
            pid = rr.main_pid()
            rr.send({"cmd": "weights", **self.timed_weights})
            os.kill(pid, signal.SIGCONT)
            try:
                reply = rr.recv(self.opts.run_timeout_s)
            finally:
                stop(pid)
            if reply.get("kind") != "weighed":
                raise RuntimeError(f"{reply.get('where')}: {reply.get('error')}")
            rr.weights = want
        except (EOFError, TimeoutError, OSError, RuntimeError) as e:
            self.dev.drop_ref_runner()
            raise RuntimeError(f"the reference's runner failed ({e!r})") from None

    def _host_ref_batch(self, seed: int, n: int, chosen: list[int] | None = None,
                        pick: list[int] | None = None) -> clock.Batch:
        """A batch of the reference's runner, timed as the candidate's are (_host_cand_batch): the n sets of
        the seed, or with `pick` those of them, in that order; with `chosen` (calls of this batch), the
        outputs of those calls are what the candidate's are checked against (CPU: read from it now; GPU:
        read by the reference worker, where the claim says). Its failure is the reference's: RuntimeError,
        and a new runner for the next timing."""
        rr, gpu = self.rr, self.ev.device == "cuda"
        if n == 0:   # a batch of no calls (the last layout, emptied): what a batch costs with nothing in it
            layout = dict(self._ref_layout, n=0)
        else:
            layout = self._expect(self.dev.ref_call({"cmd": "fill", "seed": seed, "n": n, "target": "reference",
                                                     "pick": pick}), "filled")["layout"]
            self._ref_layout = layout
        n = int(layout["n"])
        try:
            pid = rr.main_pid()
            stop(pid)   # stopped already, except in its first batch
            b = clock.Batch("ref", n)
            if gpu and self._drain(b, "settle") is not None:   # as the candidate's: the same steps, both sides
                raise RuntimeError("the GPU stayed busy before the reference's batch")
            if gpu:
                self._time_host(b)
            reply = self._let_go(rr, pid, {"cmd": "go", "layout": layout}, b)
            if reply.get("kind") != "done":
                raise RuntimeError(f"the reference's runner answered {reply.get('kind')}: {reply.get('error')}")
            if gpu and self._drain(b, "probe") is not None:
                raise RuntimeError("the GPU stayed busy after the reference's batch")
            inputs = self._input_ranges(rr, pid, layout)
            if self._ref_geometry is None:
                self._ref_geometry = reply["geometry"]
                self._ref_views = readout.views_of_inputs(reply, inputs)
            if chosen is not None:
                c = readout.claim(reply, n, self._ref_geometry, within=rr.region[2] if gpu else None)
                if isinstance(c, str) or (not gpu and readout.write(self._ref_path, self.rr_mem, c, chosen) is not None):
                    raise RuntimeError(f"the reference's outputs could not be read: {c}")
                self._ref_claim = c
        except (EOFError, TimeoutError, OSError, RuntimeError) as e:
            self.dev.drop_ref_runner()
            raise RuntimeError(f"the reference's runner failed ({e!r})") from None
        return b

    def _host_cand_batch(self, seed: int, n: int, drawn: int):
        """One batch of the runner's: (Batch, its checked claim of where its outputs lie) or (a rejection,
        None). Its inputs, the first n of `drawn` sets, are written into its memory while it is stopped (the
        reference's runner gets some of those sets next); it runs only inside its one step, timed with it stopped before and after (on a
        GPU the device is then drained, the wait charged to the batch)."""
        gpu = self.ev.device == "cuda"
        pick = list(range(n)) if drawn > n else None   # (cut for memory) the first n of the sets drawn
        reply = self._expect(self.dev.ref_call({"cmd": "fill", "seed": seed, "n": drawn, "target": "runner",
                                                "pick": pick}), "filled")
        b = clock.Batch("cand", n)
        if gpu:   # nothing of the candidate's may run on the GPU while its inputs are written (and after)
            bad = self._drain(b, "settle")
            if bad is not None:
                return bad, None
            self._time_host(b)
        try:
            msg = self._let_go(self.w, self.main, {"cmd": "go", "layout": reply["layout"]}, b)
        except _LateStop as e:
            return _not_stopped(self.details, e.states), None
        if msg.get("kind") != "done":
            raise _Answered(msg)
        # (GPU) The drain starts the moment the runner has stopped, before anything else of ours takes time
        # (the search for its other processes takes milliseconds): work still running is seen, and charged,
        # from then on.
        bad = self._drain(b, "probe") if gpu else None
        if bad is None:
            bad = self._freeze()
        if bad is not None:
            return bad, None
        c = readout.claim(msg, n, self._ref_geometry or [], self._input_ranges(self.w, self.main, reply["layout"]),
                          self._ref_views, within=self.w.region[2] if gpu else None)
        if isinstance(c, str):
            return _forged(self.details, c, honest_mistake=any(m in c for m in readout.HONEST_MISTAKES)), None
        c.layout = reply["layout"]
        return b, c

    def _fitting_cand_batch(self, seed: int, n: int, ref_ms: float, fixed: float, empty: float, n_ref: int):
        """(Shared memory) The candidate's batch: (Batch, claim, seed, n), its inputs n of the at least n_ref
        sets drawn (the reference's next batch runs n_ref of them). Where its outputs outgrow its region (an
        honest candidate may hold more memory a call than the reference does: an output that is a view of a
        padded buffer), again with a quarter of the calls, its batches from then on, while the calls still
        outlast four times a batch's fixed cost. The reference's batches keep their length, and a cut
        batch has only what a batch of no calls costs (`empty`) taken off, not the fixed cost: that
        estimate holds the reference's own start-up within a call (its first launch, the gaps between its
        first kernels), which a batch of one call pays in full; a candidate that claimed to be out of
        memory to get batches of one call read 2.43-2.46x against its twin's 2.34x on conv_groupnorm
        while both sides were cut. The device is drained after a failed try, and each try draws inputs
        from a new seed: the calls of a batch that failed may have computed their outputs."""
        while True:
            try:
                c, values = self._host_cand_batch(seed, n, max(n, n_ref))
                if "calls_cut_for_memory" in self.details and not isinstance(c, EvalResult):
                    c.fixed = empty
                return c, values, seed, n
            except _Answered as e:
                fewer = n // 4
                if not (e.msg.get("out_of_memory") is True and self.ev.device == "cuda" and fewer >= 1
                        and fewer * ref_ms >= 4 * max(fixed * 1e3, 0.5)):
                    raise
                self.details.setdefault("calls_cut_for_memory", []).append([n, fewer])
                # Whatever the failed step left on the device ends before the next inputs are written (a
                # kernel polling the region for them would otherwise compute them during the fill).
                bad = self._drain(self._armed, "probe")
                if bad is not None:
                    return bad, None, seed, n
                seed, n = secrets.randbits(31), fewer

    def _let_go(self, w: Worker, pid: int, req: dict, b: clock.Batch) -> dict:
        """Send a stopped runner its step, let it run, and stop it again when it answers: b.calls is the
        step's time (CPU: the runner's CPU time, read stopped; GPU: this process's clock from the moment it
        is let go until every thread of it has stopped, the device's remaining work then drained by the
        caller, from a drain armed here and fired the moment the runner answers)."""
        gpu = self.ev.device == "cuda"
        if gpu:
            self._arm(w)
            self._armed = b
        stopped = True
        w.send(req)
        t = time.monotonic() if gpu else cpu_seconds(pid, stopped=True)
        os.kill(pid, signal.SIGCONT)
        if w is self.w:
            self._frozen = False
        try:
            reply = w.recv(max(0.0, self.deadline - time.monotonic())) if w is self.w else w.recv(self.opts.run_timeout_s)
        finally:
            if gpu:   # (if the prober has not seen the answer yet) the drain starts now, before the stop
                self.dev.fire()
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                pass
            stopped = stop(pid, signal_sent=True)
            if gpu:   # until every thread has stopped: one that holds off the stop (in vfork, its child
                # waiting for the device) is still the step's, and so is what the device does meanwhile
                self._stopped_at = time.monotonic()
                b.calls = self._stopped_at - t
            if w is self.w:
                self._frozen = True
        if not gpu:
            b.calls = cpu_seconds(pid, stopped=True) - t
        if not stopped and w is self.w:   # its clock was read while a thread of it still ran
            raise _LateStop(running_states(pid))
        return reply

    def _input_ranges(self, w: Worker, pid: int, layout: dict) -> list[tuple[int, int]]:
        """Where a runner's inputs lie: CPU, its input file's mappings (addresses); GPU, the region's input
        part (offsets, as its claim gives them)."""
        if self.ev.device == "cuda":
            return [(0, w.region[3])]
        st = os.fstat(w.arena[0])
        return readout.mappings(pid, st.st_dev, st.st_ino)

    def _stop_runner(self, b: clock.Batch) -> EvalResult | None:
        """The runner stopped, and (GPU) the device drained before the reference runs: the wait is the
        candidate batch's probe step."""
        bad = self._freeze()
        if bad is None and self.ev.device == "cuda":
            bad = self._drain(b, "probe")
        return bad


class _LateStop(Exception):
    """A thread of the runner still ran a second after the stop that ended its step."""

    def __init__(self, states: list[str]):
        super().__init__(states)
        self.states = states


class _Answered(Exception):
    """The runner answered out of turn (an error report, or a forged kind)."""

    def __init__(self, msg: dict):
        super().__init__(msg.get("kind"))
        self.msg = msg

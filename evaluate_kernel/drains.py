"""Parent side, GPU: the device drained before and after every timed batch, and what the drains charge.

A batch's time on a GPU runs from the moment its stopped runner is let go until every thread of it has
stopped again, plus whatever the device still does then: work left running on any stream after a call is
part of the call. So before each batch (settle) and after it (probe) the prober, a context of its own,
probes until the device is quiet, and the busy time it finds is charged to the batch. Both sides' batches
pay the same drains, so the switch of contexts each costs is taken off alike (Device.switch_ms).

    _arm / _drain      armed before a batch's step, fired the moment its runner answers; or run now
    _charge            what a drain's reply charges: a first probe beyond a switch, and the busy time
    _drain_limits      each probe step's limit: quiet, after a switch, and the check after the pause

Drains is a part of Timing (timing.py, through steps.py), kept apart only to be read apart.
"""
from __future__ import annotations

import math

from . import clock
from .common import EvalResult
from .protocol import Worker

IDLE_PROBES = 3   # fast probes in a row that say the GPU is idle (_drain)
COPY_SLACK_MS = 0.05   # a probe's copy is busy beyond twice its idle time and this (idle: ~0.03 ms a MiB)


class Drains:
    """The drains of a Timing (its device self.dev, options, details, runner)."""

    def _drain(self, b: clock.Batch, phase: str) -> EvalResult | None:
        """(GPU) Have the prober (a context of its own, so either side pays the same switches) probe until a
        trivial kernel and a copy each way run at once IDLE_PROBES times in a row: the device holds no one's
        work, on its compute or its copy engines. (Without MPS the GPU time-slices between contexts, and
        while another context's kernel runs one probe in several still lands at the start of a slice: a
        single fast probe let a kernel that never ends through.) The first probe waits for the GPU to
        switch contexts as well, so it is judged against what that costs (Device.switch_ms, from the
        drains after the reference runner's batches), and the others against an idle device.

        The batch's `phase` (settle: before "go" with shared memory, after "done" in the fallback; probe:
        after the batch) is the time the device was busy: how much longer the first probe's steps took
        than a switch, and if it was not quiet, the time from its end until the quiet run began
        (batches.drain, timed in the prober, where nothing but its loop lies between two probes). On an
        idle device that is the switch's jitter, a few hundredths of a millisecond. (Charging every drain
        whose first probe was slow its whole round trip, 0.8 ms, charged an honest batch in ten to
        seventeen per cent of the drains, at random: 1-3% on the speedup of a 2 ms call.)"""
        limits, first_limits, check, switch = self._drain_limits()
        note = b.side == "ref" and phase == "probe"
        charged = 0.0
        if phase == "probe" and self.dev.armed is not None and getattr(self, "_armed", None) is b:
            r = self.dev.collect()   # armed before the batch's step, started when its runner answered
            charged = self._charge(r, limits, switch, note)
            if charged is None:
                return self._busy()
            at = r.get("quiet_at")
            if isinstance(at, (int, float)) and at >= self._stopped_at:
                setattr(b, phase, charged)
                return None
            # Found quiet while the runner could still run (before it had stopped): work it started after
            # that is seen by a drain now. An honest batch, over before its answer, pays nothing for it.
            note = False
            self.details["drains_after_stop"] = self.details.get("drains_after_stop", 0) + 1
        r = self.dev.drain(limits, first_limits, check, IDLE_PROBES, self.opts.drain_s)
        more = self._charge(r, limits, switch, note)
        if more is None:
            return self._busy()
        setattr(b, phase, charged + more)
        return None

    def _charge(self, r: dict, limits: dict, switch: dict, note: bool) -> float | None:
        """(GPU) What a drain's reply charges: its first probe's steps beyond a switch, and the busy time
        after it; None where the device never went quiet. With `note`, the first probe teaches what a
        switch costs (after the reference's runner: no candidate's work can have run into it, where a
        settle follows a fill)."""
        first = r.get("first") or {}
        if note:
            self.dev.note_switch(first)
        busy = r.get("busy_s")
        if not r.get("quiet") or not isinstance(busy, (int, float)) or not math.isfinite(busy):
            return None
        steps = {k: float(first.get(k, math.inf)) for k in limits}
        return sum(max(0.0, v - switch[k]) for k, v in steps.items() if math.isfinite(v)) / 1e3 + busy

    def _busy(self) -> EvalResult:
        return EvalResult("rejected", message=f"rejected: the GPU was still busy {self.opts.drain_s:.0f} s after "
                          "the candidate's calls returned: work left running after a call is part of the call",
                          details=self.details)

    def _arm(self, w: Worker) -> None:
        """(GPU) The drain after a batch is armed before its step, and starts the moment the runner's answer
        is on its pipe (Device.drain)."""
        limits, first_limits, check, _ = self._drain_limits()
        self.dev.drain(limits, first_limits, check, IDLE_PROBES, self.opts.drain_s, armed=True, watch=w)

    def _drain_limits(self) -> tuple[dict, dict, dict, dict]:
        """(GPU) Each probe step's limit for a quiet probe, the first probe's (after a switch of contexts),
        the check's after the pause (batches.drain: below a switch, which would say that another context
        took the GPU in the pause), and what a switch costs."""
        info = self.dev.info
        idle = {"ms": float(info.get("probe_ms") or 0.05), **(info.get("probe_copy_ms") or {})}
        limits = {k: max(self.opts.probe_ms, 4 * v) if k == "ms" else 2 * v + COPY_SLACK_MS for k, v in idle.items()}
        switch = self.dev.switch_ms() or {}
        switch = {k: switch.get(k, v) for k, v in idle.items()}
        check = dict(limits, ms=min(limits["ms"], max(4 * idle["ms"], switch["ms"] / 2)))
        return limits, {k: max(limits[k], 2 * switch[k] + COPY_SLACK_MS) for k in limits}, check, switch

"""The GPU's shared-memory protocol (evaluate_kernel.vmm, host_batches.GpuArena, readout.claim(within=)):
the parts that need no GPU are tested here on their own (the pool's ranges, a descriptor taken from
another process and passed on a channel, the claim's checks in offsets, the region's layout); the rest
runs on a GPU and is skipped cleanly without one.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from evaluate_kernel import readout, vmm
from evaluate_kernel.device import Device
from evaluate_kernel.worker import _receive_fd

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 5000)), max_size=60), st.integers(1, 3000))
def test_the_pools_pieces_never_overlap_stay_inside_and_come_back_whole(ops, lo):
    """Whatever the caching allocator asks and gives back: every live piece aligned, inside [lo, hi),
    apart from every other; all given back, the free ranges are one again."""
    hi = lo + 40_000
    ranges = vmm.FreeRanges(lo, hi)
    start = -(-lo // vmm.ALIGN) * vmm.ALIGN
    live: list[tuple[int, int]] = []
    for take, size in ops:
        if take or not live:
            at = ranges.take(size)
            if at is None:   # only when no free range has room for it
                assert all(room < -(-size // vmm.ALIGN) * vmm.ALIGN for _, room in ranges.free)
                continue
            assert at % vmm.ALIGN == 0 and start <= at and at + size <= hi
            assert all(at + size <= a or a + s <= at for a, s in live)
            live.append((at, size))
        else:
            at, size = live.pop(size % len(live))
            ranges.give(at, size)
    for at, size in live:
        ranges.give(at, size)
    assert ranges.free == [(start, hi - start)]


def test_a_pool_that_is_full_says_so_and_recovers_what_is_given_back():
    ranges = vmm.FreeRanges(vmm.ALIGN, 5 * vmm.ALIGN)   # addresses are never 0 (a null pointer)
    a, b = ranges.take(2 * vmm.ALIGN), ranges.take(2 * vmm.ALIGN)
    assert ranges.take(1) is None   # torch then raises its out-of-memory error
    ranges.give(a, 2 * vmm.ALIGN)
    assert ranges.take(vmm.ALIGN) == a and ranges.take(vmm.ALIGN) == a + vmm.ALIGN
    ranges.give(None, 5)   # a null pointer given back changes nothing
    assert b is not None and ranges.take(1) is None


def test_a_descriptor_is_taken_from_a_child_and_passed_on_a_channel(tmp_path):
    """The parent takes the reference worker's descriptor (pidfd_getfd: it is the worker's ancestor) and
    sends it to a runner on its channel; what arrives is the same open file."""
    path = tmp_path / "f"
    path.write_bytes(b"the region")
    child = subprocess.Popen([sys.executable, "-c", "import os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); "
                              "print(fd, flush=True); sys.stdin.read()", str(path)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        theirs = int(child.stdout.readline())
        try:
            fd = vmm.pidfd_getfd(child.pid, theirs)
        except OSError as e:   # a kernel before 5.6, or tracing forbidden here
            pytest.skip(f"pidfd_getfd: {e}")
        ours, runner_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        socket.send_fds(ours, [b"fd"], [fd])
        os.close(fd)
        got = _receive_fd(runner_end.fileno())
        assert os.pread(got, 100, 0) == b"the region"
        os.close(got)
        ours.close()
        runner_end.close()
    finally:
        child.kill()
        child.wait()


def test_a_channel_that_brings_nothing_is_an_error():
    ours, runner_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    ours.send(b"no descriptor")
    with pytest.raises(OSError):
        _receive_fd(runner_end.fileno())
    ours.close()
    runner_end.close()


REF = [["float32", [4, 8], [8, 1]]]


def _reply(offsets):
    import array
    import base64
    return {"packed": base64.b64encode(array.array("q", offsets).tobytes()).decode(), "geometry": REF}


def test_a_claim_in_offsets_inside_the_region_is_accepted():
    c = readout.claim(_reply([0, 128, 256]), 3, REF, within=1024)
    assert not isinstance(c, str) and c.pointers == [[0], [128], [256]]


@pytest.mark.parametrize("offsets, why", [
    ([0, 128, 1000], "outside the memory"),      # runs past the region's end
    ([0, 128, 2], "outside the memory"),         # not aligned to its element
    ([0, 64, 256], "same memory"),               # overlaps call 0's 128 bytes
    ([0, 128, -128], "another number"),          # before the region
])
def test_a_claim_in_offsets_that_does_not_hold_is_refused(offsets, why):
    problem = readout.claim(_reply(offsets), 3, REF, within=1024)
    assert isinstance(problem, str) and why in problem


def test_no_output_may_lie_in_the_regions_input_part():
    problem = readout.claim(_reply([0, 512, 640]), 3, REF, inputs=[(0, 512)], within=1024)
    assert isinstance(problem, str) and "input" in problem


class _Opts:
    batch_bytes = 0


class _Ev:
    opts = _Opts()


def _device(total: int, peak: int, out: int) -> Device:
    d = object.__new__(Device)
    d.ev, d.info = _Ev(), {"total_mem": total, "peak_bytes": peak, "out_bytes": out}
    return d


@settings(max_examples=100, deadline=None)
@given(st.integers(1 << 30, 200 << 30), st.integers(0, 8 << 30), st.integers(0, 1 << 30))
def test_a_regions_layout_fits_the_device_and_leaves_room_for_the_calls(total, peak, out):
    size, inputs = _device(total, peak, out).region_layout()
    mib2 = 2 << 20
    assert size % mib2 == 0 and inputs % mib2 == 0
    assert size <= total // 4 + mib2
    assert 0 < inputs and 2 * inputs <= size   # as much again for the outputs, and the rest


@needs_gpu
@pytest.mark.gpu
def test_a_region_made_here_is_read_through_another_mapping():
    """The reference worker's mapping and the runner's see the same memory (one process standing for
    both: a descriptor exported, imported, mapped twice)."""
    r = vmm.Region.make(4 << 20, 0)
    other = vmm.Region.open(os.dup(r.fd), r.size, 0)
    try:
        r.bytes[:1024].copy_(torch.arange(1024, device="cuda", dtype=torch.int32).view(torch.uint8)[:1024])
        torch.cuda.synchronize()
        assert torch.equal(other.bytes[:1024], r.bytes[:1024])
        pool = vmm.Pool(other, 2 << 20)
        with torch.cuda.use_mem_pool(pool.pool):
            t = torch.ones(1000, device="cuda")
        assert other.ptr + (2 << 20) <= t.data_ptr() < other.ptr + other.size
        del t
    finally:
        other.close()
        r.close()


class _Prober:
    """A device whose probes are slow (busy) a given number of times, then fast, taking `each` s apiece;
    its first probe takes `first` ms on the kernel (a switch of contexts, or work left running)."""

    def __init__(self, busy: int, each: float = 0.002, first: float = 0.02, switch: dict | None = None):
        self.busy, self.each, self.first, self.calls = busy, each, first, 0
        self.info = {"probe_ms": 0.02, "probe_copy_ms": {"h2d": 0.03, "d2h": 0.03}}
        self.switch, self.noted = switch, []
        self.armed, self.t = None, 0.0

    def probe(self) -> dict:
        self.t += self.each   # (a clock of its own: the loop's own time is none, whatever the machine's load)
        self.calls += 1
        slow = self.calls <= self.busy or self.calls == self.busy + 2   # and one slow probe inside the run
        return {"ms": 5.0 if slow else self.first if self.calls == 1 else 0.02, "h2d": 0.03, "d2h": 0.03}

    def drain(self, limits, first_limits, check, runs, max_s) -> dict:
        from evaluate_kernel.batches import drain
        return drain(self.probe, limits, first_limits, runs, max_s, check=check, now=lambda: self.t,
                     sleep=self._sleep)

    def _sleep(self, s: float) -> None:
        self.t += s

    def switch_ms(self):
        return self.switch

    def note_switch(self, r: dict) -> None:
        self.noted.append(r)


def _drainer(dev):
    from evaluate_kernel.common import Options
    from evaluate_kernel.timing import Timing

    class T(Timing):
        pass
    t = T()
    t.opts, t.dev, t.details = Options(), dev, {}
    return t


SWITCH = {"ms": 0.2, "h2d": 0.1, "d2h": 0.04}   # an H100's first probe after another context's work


def test_a_drain_charges_the_time_the_device_was_busy_and_nothing_on_an_idle_one():
    """Idle: nothing, however long the probes' round trips take (they are the same for both sides and
    would only add noise), even where the first probe paid the switch of contexts. Busy: the time until
    the quiet run of IDLE_PROBES began; a slow probe inside a run starts it again."""
    from evaluate_kernel import clock
    from evaluate_kernel.drains import IDLE_PROBES
    b = clock.Batch("cand", 1)
    idle = _Prober(busy=0, first=0.2, switch=SWITCH)
    idle.calls = 2   # its one slow probe (busy + 2) is behind it; the next is not its first: an idle one
    # (each quiet run is followed by one probe more, after a pause: batches.drain)
    assert _drainer(idle)._drain(b, "probe") is None and b.probe == 0.0 and idle.calls == 2 + IDLE_PROBES + 1
    switching = _Prober(busy=0, first=0.19, switch=SWITCH)
    switching.busy = -5   # no slow probe at all
    assert _drainer(switching)._drain(b, "probe") is None and b.probe == 0.0 and switching.calls == IDLE_PROBES + 1
    busy = _Prober(busy=3, switch=SWITCH)
    assert _drainer(busy)._drain(b, "settle") is None
    assert busy.calls == 3 + 1 + 1 + IDLE_PROBES + 1   # three slow, one fast, one slow, the quiet run, the check
    # the first probe's wait beyond a switch (4.8 ms), then from its end to the quiet run: four probes
    assert 4.8e-3 + 4 * busy.each * 0.9 <= b.settle <= 4.8e-3 + 4 * busy.each + 0.05


def test_work_left_running_is_charged_by_how_long_it_held_the_first_probe():
    """A first probe that waited 0.3 ms beyond a switch, then quiet ones: 0.3 ms, not a whole round trip
    (the charge grows with the work left, from zero, with no step an honest switch falls over at random)."""
    from evaluate_kernel import clock
    for first in (0.25, 0.5, 0.8):
        p = _Prober(busy=0, first=first, switch=SWITCH, each=0.003)
        p.busy = -5
        b = clock.Batch("cand", 1)
        assert _drainer(p)._drain(b, "probe") is None
        assert abs(b.probe - (first - SWITCH["ms"]) / 1e3) < 1e-9


class _Clock:
    """A probe sequence on a clock of its own: each probe is (its kernel's ms, seconds before the next)."""

    def __init__(self, probes: list[tuple[float, float]]):
        self.t, self.probes, self.slept, self.gap, self.reads = 0.0, list(probes), [], 0.0, 0

    def now(self) -> float:
        self.reads += 1
        if self.reads == 2:   # the loop's own time: after this probe's end was read, before the next began
            self.t += self.gap
        return self.t

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.t += s

    def probe(self) -> dict:
        ms, self.gap = self.probes.pop(0)
        self.t += ms / 1e3
        self.reads = 0
        return {"ms": ms, "h2d": 0.02, "d2h": 0.02}


LIMITS = {"ms": 0.1, "h2d": 0.1, "d2h": 0.1}
FIRST_LIMITS = {"ms": 0.5, "h2d": 0.3, "d2h": 0.3}
CHECK = {"ms": 0.08, "h2d": 0.1, "d2h": 0.1}


def test_work_that_runs_on_between_two_probes_is_charged_until_the_quiet_run_begins():
    """The first probe waited for work left running (a time slice of it), and the work ran on while the
    probe's reply went out and the next probe came: that time is the device's busy time too, up to the
    start of the probe that found it quiet (sent from the parent one at a time, the round trip between
    the two was never charged: +4.8% on a 1.7 ms call whose last call's work was left running)."""
    from evaluate_kernel.batches import drain
    c = _Clock([(0.9, 400e-6), (0.02, 0), (0.02, 0), (0.02, 0), (0.02, 0)])
    r = drain(c.probe, LIMITS, FIRST_LIMITS, 3, 5.0, check=CHECK, now=c.now, sleep=c.sleep)
    assert r["quiet"] and r["probes"] == 5 and r["first"]["ms"] == 0.9 and len(c.slept) == 1
    assert abs(r["busy_s"] - 400e-6) < 1e-12   # from the first probe's end to the quiet run's start
    # a first probe that is quiet: nothing, however the loop's own gaps fall
    c = _Clock([(0.3, 0.5), (0.02, 0.4), (0.02, 0), (0.02, 0)])
    r = drain(c.probe, LIMITS, FIRST_LIMITS, 3, 5.0, check=CHECK, now=c.now, sleep=c.sleep)
    assert r["quiet"] and r["busy_s"] == 0.0
    # a step missing from a probe is not quiet; a device never quiet within max_s says so
    r = drain(lambda: {"ms": 0.02}, LIMITS, FIRST_LIMITS, 3, 0.01)
    assert not r["quiet"] and r["busy_s"] is None and r["probes"] >= 1


def test_work_put_off_while_the_probes_ran_is_found_by_the_probe_after_the_pause():
    """The GPU serves a waiting context between another's kernels: the last call's final kernel waited
    while the probes ran and found the device quiet, then ran once they stopped (+2% on a 1.7 ms call,
    uncharged). After the pause the next probe waits for it, or pays the switch back: the run starts
    again, and the device was busy from that probe's start until the quiet run after it."""
    from evaluate_kernel.batches import drain
    c = _Clock([(1.2, 0), (0.02, 0), (0.02, 0), (0.02, 0),   # the first probe waited; a quiet run
                (0.35, 0),                                      # after the pause: the put-off kernel
                (0.02, 0), (0.02, 0), (0.02, 0), (0.02, 0)])    # quiet, and the check after the pause
    r = drain(c.probe, LIMITS, FIRST_LIMITS, 3, 5.0, check=CHECK, yield_s=0.0005, now=c.now, sleep=c.sleep)
    assert r["quiet"] and r["probes"] == 9 and len(c.slept) == 2
    # busy: the slow check, from its start until the next quiet run (not the quiet run or the pause
    # before it, which a check slow by chance would charge an honest batch)
    assert abs(r["busy_s"] - 0.35e-3) < 1e-9
    # a check that pays a switch back (another context ran in the pause, and is done) starts it again too
    c = _Clock([(0.02, 0), (0.02, 0), (0.02, 0), (0.2, 0), (0.02, 0), (0.02, 0), (0.02, 0), (0.02, 0)])
    r = drain(c.probe, LIMITS, FIRST_LIMITS, 3, 5.0, check=CHECK, now=c.now, sleep=c.sleep)
    assert r["quiet"] and r["probes"] == 8 and abs(r["busy_s"] - 0.2e-3) < 1e-9


class _ArmedDevice:
    """A device whose armed drain found it quiet at `quiet_at`; a drain after it sees `later` ms of work."""

    def __init__(self, quiet_at: float, later: float = 0.0):
        self.info = {"probe_ms": 0.02, "probe_copy_ms": {"h2d": 0.03, "d2h": 0.03}}
        self.armed, self.quiet_at, self.later, self.drains, self.noted = 5.0, quiet_at, later, 0, []

    def collect(self) -> dict:
        self.armed = None
        return {"first": dict(SWITCH), "busy_s": 0.0, "quiet": True, "quiet_at": self.quiet_at}

    def drain(self, limits, first_limits, check, runs, max_s) -> dict:
        self.drains += 1   # the prober's context is current: no switch, the work's wait only
        return {"first": {"ms": 0.02 + self.later, "h2d": 0.03, "d2h": 0.03}, "busy_s": 0.0, "quiet": True,
                "quiet_at": 1e9}

    def switch_ms(self):
        return SWITCH

    def note_switch(self, r: dict) -> None:
        self.noted.append(r)


def test_a_drain_found_quiet_before_the_runner_stopped_is_followed_by_another():
    """The armed drain starts on the runner's answer, while the runner still runs until we stop it: a
    runner that answers with the device idle, waits out the drain and then starts work would have that
    work run uncharged. A drain found quiet before the stop is followed by one after it, whose charge is
    added; one found quiet after the stop is enough (an honest batch's usual case costs nothing)."""
    from evaluate_kernel import clock
    for quiet_at, later, drains, charge in ((10.0, 0.0, 1, 0.0), (10.0, 1.5, 1, 1.5e-3 - 0.2e-3 + 0.02e-3),
                                            (12.0, 1.5, 0, 0.0)):
        dev = _ArmedDevice(quiet_at, later)
        t = _drainer(dev)
        b = clock.Batch("ref", 1)
        t._armed, t._stopped_at = b, 11.0
        assert t._drain(b, "probe") is None
        assert dev.drains == drains and abs(b.probe - charge) < 1e-9
        assert t.details.get("drains_after_stop", 0) == drains   # (counted in the details)
        assert len(dev.noted) == 1   # only the armed drain's first probe follows a switch


def test_only_the_reference_sides_first_probes_teach_what_a_switch_costs():
    """Only the drains after the reference runner's batches: a candidate that leaves work behind would
    otherwise raise the allowance its own work hides under (a settle follows the reference worker's
    fill, which a candidate's leftover work may still overlap)."""
    from evaluate_kernel import clock
    for side, phase, noted in (("ref", "probe", 1), ("cand", "probe", 0), ("ref", "settle", 0)):
        p = _Prober(busy=0, first=0.2, switch=None)
        p.busy = -5
        assert _drainer(p)._drain(clock.Batch(side, 1), phase) is None
        assert len(p.noted) == noted


def test_a_switch_costs_the_median_of_the_reference_sides_first_probes_capped():
    from evaluate_kernel.device import SWITCH_CAP_MS, SWITCHES_KEPT, Device
    d = Device.__new__(Device)
    import collections
    d.switches = collections.deque(maxlen=SWITCHES_KEPT)
    assert d.switch_ms() is None
    for ms in (0.2, 0.18, 0.25, 50.0, 0.21):
        d.note_switch({"ms": ms, "h2d": 0.1, "d2h": 0.04, "kind": "probed"})
    d.note_switch({"ms": float("nan"), "h2d": 0.1, "d2h": 0.04})   # refused: not a time
    assert d.switch_ms() == {"ms": 0.21, "h2d": 0.1, "d2h": 0.04}
    for _ in range(SWITCHES_KEPT):
        d.note_switch({"ms": 7.0, "h2d": 0.1, "d2h": 0.04})
    assert d.switch_ms()["ms"] == SWITCH_CAP_MS


class _Stub:
    """A runner that answers at once; the steps around it recorded in order."""

    def __init__(self, order: list):
        self.order = order

    def send(self, msg):
        self.order.append("send")

    def recv(self, timeout=None):
        return {"kind": "done", "ok": True}


def _gpu_timing(order: list):
    from types import SimpleNamespace

    from evaluate_kernel.common import Options
    from evaluate_kernel.timing import Timing

    class T(Timing):
        def _drain(self, b, phase):
            order.append(f"drain {phase}")

        def _freeze(self):
            order.append("freeze")

        def _time_host(self, b):
            order.append("host loop")
    t = T()
    t.opts, t.details, t.deadline = Options(), {}, 1e18
    t.ev = SimpleNamespace(device="cuda")
    t.dev = SimpleNamespace(fire=lambda: order.append("fire"))
    t._arm = lambda w: order.append("arm")
    t.w, t.main = _Stub(order), os.getpid()
    t._expect = lambda reply, kind: reply
    return t


def test_a_gpu_batchs_clock_runs_until_every_thread_of_the_runner_has_stopped(monkeypatch):
    """A thread that holds off the stop (waiting in vfork for a child that waits for the device) keeps
    the clock going: the device's work meanwhile is the step's (seventeenth red team: +6-14% while the
    wait was outside the clock)."""
    import signal
    import time

    from evaluate_kernel import clock, steps
    order: list = []
    t = _gpu_timing(order)
    monkeypatch.setattr(steps.os, "kill", lambda pid, sig: order.append(signal.Signals(sig).name))
    monkeypatch.setattr(steps, "stop", lambda pid, signal_sent=False: (time.sleep(0.05), order.append("stopped")))
    b = clock.Batch("cand", 1)
    t._let_go(t.w, os.getpid(), {"cmd": "go"}, b)
    # the drain, armed before the step, starts the moment the runner answers, before it is stopped
    assert order == ["arm", "send", "SIGCONT", "fire", "SIGSTOP", "stopped"] and b.calls >= 0.05


def test_a_gpu_batch_is_drained_the_moment_its_runner_stops_before_anything_else_of_ours():
    """The search for the runner's other processes takes milliseconds: a device still busy with its
    calls then went idle before the drain began, uncharged (seventeenth red team: +7%)."""
    from types import SimpleNamespace

    from evaluate_kernel import readout
    order: list = []
    t = _gpu_timing(order)
    t.dev = SimpleNamespace(ref_call=lambda req: {"kind": "filled", "layout": {}}, fire=lambda: None)
    t._let_go = lambda w, pid, req, b: (order.append("go"), {"kind": "done"})[1]
    t._ref_geometry, t._ref_views = [], None
    t.w.region = (0, 0, 1 << 20, 1 << 10)
    orig = readout.claim
    readout.claim = lambda *a, **k: "stop here"
    try:
        t._host_cand_batch(1, 1, 1)
    finally:
        readout.claim = orig
    assert order == ["drain settle", "host loop", "go", "drain probe", "freeze"]   # the loop: clock.steady_pairs


def test_a_device_that_never_goes_quiet_rejects_the_candidate():
    from evaluate_kernel import clock
    t = _drainer(_Prober(busy=10 ** 9, each=0.001))
    t.opts.drain_s = 0.05
    bad = t._drain(clock.Batch("cand", 1), "probe")
    assert bad is not None and bad.status == "rejected" and "still busy" in bad.message


def test_a_region_that_cannot_be_made_or_passed_leaves_the_runner_without_one():
    """The evaluation then runs the fallback protocol: a reference worker that refuses, dies, or whose
    descriptor cannot be taken gives a reason, never an exception out of the evaluation's start."""
    class _W:
        region, on_kill = None, None

    def device(ref_call, ref=None) -> Device:
        d = _device(80 << 30, 1 << 30, 1 << 20)
        d.ref_call, d.ref, d.ref_starts = ref_call, ref, 1
        d.ref_lock = __import__("threading").Lock()
        return d

    def refuses(req):
        return {"kind": "error", "error": "CUresult 2"}

    def dies(req):
        raise RuntimeError("reference worker died")

    class _Gone:
        proc = type("P", (), {"poll": staticmethod(lambda: 0)})()

        @staticmethod
        def main_pid():
            raise EOFError("the worker's namespace has no process")

    def makes(req):
        return {"kind": "region", "id": 7, "fd": 3, "size": 4 << 20} if req["cmd"] == "region" else {"kind": "ok"}

    for ref_call, ref, why in [(refuses, None, "could not make"), (dies, None, "failed while making"),
                               (makes, _Gone(), "could not be passed on")]:
        w = _W()
        problem = device(ref_call, ref).give_region(w)
        assert isinstance(problem, str) and why in problem and w.region is None and w.on_kill is None


def test_a_fixed_cost_is_measured_in_pairs_next_to_each_other_in_time():
    """Whatever drifts during the measurement (the GPU's clock follows its load) touches both batches of
    a pair alike: measured as five batches of one call, then five of n, a slow start read a fixed cost
    ten times too large; in pairs next to each other it spoils one pair of five. Each measured batch
    follows one of its own size."""
    from evaluate_kernel import clock
    from evaluate_kernel.common import Options
    from evaluate_kernel.timing import EMPTY_BATCHES, FIXED_PAIRS, Timing
    fixed, per_call, n = 0.001, 0.004, 6
    ran = []

    class T(Timing):
        def _host_ref_batch(self, seed, size, chosen=None, pick=None):
            slow = 2.5 if len(ran) < 6 else 1.0   # the first six batches at a low clock
            ran.append(size)
            return clock.Batch("ref", size, calls=slow * (fixed + size * per_call))
    t = T()
    t.opts, t.details = Options(), {}
    found, empty = t._fixed_cost(n)
    assert abs(found - fixed) < 1e-9 and abs(empty - fixed) < 1e-12   # a batch of no calls: its fixed part
    assert len(ran) == 4 * FIXED_PAIRS + 2 * EMPTY_BATCHES and ran[4 * FIXED_PAIRS:] == [0] * 2 * EMPTY_BATCHES
    assert all(ran[i] == ran[i + 1] for i in range(0, len(ran), 2))   # each measured one after its own size
    assert len(t.details["batch_fixed_tries"][0]["pairs_ms"]) == FIXED_PAIRS


def test_a_fixed_cost_is_measured_again_while_its_pairs_disagree():
    """Pairs measured while something shared the core or the device disagree (an Evaluator confined to one
    core, beside its own start-up, read 7.5 ms for 0.8): measured again, and the steadiest try is the figure."""
    from evaluate_kernel import clock
    from evaluate_kernel.common import Options
    from evaluate_kernel.timing import FIXED_PAIRS, FIXED_TRIES, Timing
    fixed, per_call, n = 0.0008, 0.004, 4
    noisy = [1, 3.0, 1, 1.2, 1, 1.0, 1, 4.0, 1, 2.5, 1, 1.1, 1, 1.5, 1, 3.5, 1, 1.0, 1, 2.0]   # a try, disturbed
    ran = []

    def make(quiet_from):
        class T(Timing):
            def _host_ref_batch(self, seed, size, chosen=None, pick=None):
                k = len(ran)
                ran.append(size)
                slow = noisy[k % len(noisy)] if k < quiet_from else 1.0
                return clock.Batch("ref", size, calls=slow * (fixed + size * per_call))
        t = T()
        t.opts, t.details = Options(), {}
        return t
    t = make(quiet_from=4 * FIXED_PAIRS)
    assert abs(t._fixed_cost(n)[0] - fixed) < 1e-9
    tries = t.details["batch_fixed_tries"]
    assert len(tries) == 2 and tries[0]["spread"] > 0.05 >= tries[1]["spread"]
    ran.clear()
    t = make(quiet_from=10 ** 6)   # never quiet: every try made, the steadiest kept
    t._fixed_cost(n)
    assert len(t.details["batch_fixed_tries"]) == FIXED_TRIES == len([s for s in ran if s]) // (4 * FIXED_PAIRS)


def test_an_armed_prober_starts_on_the_first_byte_on_the_runners_pipe_and_takes_nothing():
    """Any byte starts it, not a whole answer: the parent reads what arrives, so an answer written in two
    parts left nothing whole to see, and the drain started late (nineteenth red team). A line from the
    parent starts it too. Nothing is taken from the pipe; nothing starts it while the pipe and our stdin
    are empty."""
    import threading
    import time

    from evaluate_kernel.protocol import LineReader
    from evaluate_kernel.worker import _await_answer

    def waiting(fd_in: int, watched: int) -> threading.Event:
        done = threading.Event()
        threading.Thread(target=lambda: (_await_answer(LineReader(fd_in), watched), done.set()), daemon=True).start()
        return done

    rr, rw = os.pipe()   # the runner's results
    pr, pw = os.pipe()   # our stdin
    try:
        done = waiting(pr, rr)
        time.sleep(0.1)
        assert not done.is_set()
        os.write(rw, b'{"kind": "do')   # part of an answer
        assert done.wait(5)
        assert os.read(rr, 1 << 16) == b'{"kind": "do'   # nothing was taken
        done = waiting(pr, -1)
        time.sleep(0.1)
        assert not done.is_set()
        os.write(pw, b'{"cmd": "now"}\n')
        assert done.wait(5)
    finally:
        for fd in (rr, rw, pr, pw):
            os.close(fd)


def test_a_candidate_whose_outputs_outgrow_its_region_is_timed_with_fewer_calls():
    """An honest candidate may hold more memory a call than the reference (an output that is a view of a
    padded buffer: ten times its elements), and a batch sized by the reference's outputs then runs its
    region out of memory. The batch is tried again with a quarter of the calls, the device drained first,
    on inputs from a new seed (the failed calls may have computed outputs), while the calls outlast four
    times a batch's fixed cost; any other error, or a cut below that, is the candidate's result. The
    reference's batches keep their length (the fill draws as many sets), and a cut batch has only what a
    batch of no calls costs taken off (a claim of being out of memory bought 5% on conv_groupnorm while
    the fixed cost was)."""
    from types import SimpleNamespace

    from evaluate_kernel import clock
    from evaluate_kernel.steps import _Answered
    from evaluate_kernel.timing import Timing
    oom = {"kind": "error", "where": "timing", "error": "OutOfMemoryError: CUDA out of memory", "out_of_memory": True}
    CUT = {"ref_ms": 0.02, "fixed": 0.001, "empty": 0.0004, "n_ref": 4000}

    class T(Timing):
        def __init__(self, fits, answer=oom, busy=None):
            self.ev, self.details, self.fits, self.answer = SimpleNamespace(device="cuda"), {}, fits, answer
            self.tried, self.drained, self.busy = [], [], busy

        def _host_cand_batch(self, seed, n, drawn):
            assert drawn == max(n, 4000)   # as many sets as the reference's batch runs
            self.tried.append((seed, n))
            self._armed = clock.Batch("cand", n)
            if n > self.fits:
                raise _Answered(self.answer)
            return self._armed, "claim"

        def _drain(self, b, phase):   # the failed step's own batch, drained before the next fill
            self.drained.append((b.n, phase))
            return self.busy

    t = T(fits=300)
    c, claim, seed, n = t._fitting_cand_batch(7, 4000, **CUT)
    assert (n, c.n, claim) == (250, 250, "claim") and [k for _, k in t.tried] == [4000, 1000, 250]
    assert c.fixed == 0.0004   # a cut batch: only what a batch of no calls costs is taken off
    assert len({s for s, _ in t.tried}) == 3 and seed == t.tried[-1][0] != 7
    assert t.details["calls_cut_for_memory"] == [[4000, 1000], [1000, 250]]
    assert t.drained == [(4000, "probe"), (1000, "probe")]
    # a device the failed step left busy is that result
    busy = T(fits=300, busy="busy")
    assert busy._fitting_cand_batch(7, 4000, **CUT)[0] == "busy" and len(busy.tried) == 1
    # 62 calls of 0.02 ms would last less than four times the 1 ms fixed cost: the error stands
    with pytest.raises(_Answered):
        T(fits=100)._fitting_cand_batch(7, 4000, **CUT)
    for answer in ({**oom, "out_of_memory": "yes"}, {k: v for k, v in oom.items() if k != "out_of_memory"}):
        t = T(fits=300, answer=answer)
        with pytest.raises(_Answered):
            t._fitting_cand_batch(7, 4000, **CUT)
        assert len(t.tried) == 1
    cpu = T(fits=300)
    cpu.ev.device = "cpu"
    with pytest.raises(_Answered):
        cpu._fitting_cand_batch(7, 4000, **CUT)

"""The runtime's definition (eval_figures.runtime_figures) and its bound by the parent's clock
(eval_figures.bounded_runtime): pure functions over the samples, tested without workers."""
from __future__ import annotations

import math
import statistics
import types

import pytest

from hypothesis import given
from hypothesis import strategies as st

from evaluate_kernel import figures as eval_figures
from evaluate_kernel.common import EvalResult, Options

samples = st.lists(st.floats(0.001, 100.0), min_size=1, max_size=60)


@given(samples, st.lists(st.floats(0.001, 100.0), max_size=20), st.lists(st.floats(0.001, 100.0), max_size=4))
def test_runtime_is_the_slower_of_gpu_time_and_steady_state(a, b, c):
    f = eval_figures.runtime_figures(a, b, c)
    assert math.isclose(f["gpu_ms"], statistics.median(a))
    assert math.isclose(f["kernelbench_ms"], statistics.median(b or a))
    if c:
        assert f["steady_ms"] == min(c)   # the best pass: load only ever slows a pass
        assert f["runtime_ms"] == max(f["gpu_ms"], min(c))
        assert f["bound"] == ("steady state (host)" if min(c) > f["gpu_ms"] else "gpu")
    else:
        assert f["steady_ms"] is None and f["runtime_ms"] == f["gpu_ms"]


@given(samples, st.lists(st.floats(0.001, 100.0), max_size=4))
def test_on_the_cpu_the_runtime_is_a_low_percentile_per_call(a, c):
    f = eval_figures.runtime_figures(a, [], c, gpu=False)
    assert f["runtime_ms"] == f["gpu_ms"] == f["kernelbench_ms"]
    assert math.isclose(f["gpu_ms"], statistics.quantiles(a, n=10, method="inclusive")[0]) if len(a) > 1 else \
        f["gpu_ms"] == a[0]


def test_kernelbench_figure_is_the_median_of_the_samples_without_lead():
    f = eval_figures.runtime_figures([1.0, 1.0, 1.0], [2.0, 5.0, 3.0], [0.5])
    assert f["kernelbench_ms"] == 3.0 and f["runtime_ms"] == 1.0 and f["bound"] == "gpu"


def _ev(device: str, margin=None):
    return types.SimpleNamespace(device=device, opts=Options(host_margin=margin),
                                 _max_drift=lambda: 0.10 if device == "cuda" else 1.0)


def _timing(runtime: float, host_ms: float, noise: float = 0.0) -> dict:
    return {"runtime_ms": runtime, "host_ms_per_call": host_ms, "host_noise_ms": noise}


@given(st.floats(0.001, 50.0), st.floats(0.001, 50.0), st.floats(0.0, 5.0), st.sampled_from(["cuda", "cpu"]))
def test_runtime_never_below_the_host_figure_less_noise_and_margin(runtime, host_ms, noise, device):
    t = _timing(runtime, host_ms, noise)
    got = eval_figures.bounded_runtime(_ev(device), t)
    margin = 0.05 if device == "cuda" else 0.10
    floor = max(host_ms - noise, 0.0) / (1 + margin)
    assert got >= runtime and math.isclose(got, max(runtime, floor), rel_tol=1e-12, abs_tol=1e-12)
    assert t["runtime_ms"] == got
    if floor > runtime:   # the runner's own figure is kept for the record
        assert t["runner_runtime_ms"] == runtime and t["bound"].startswith("host clock")


def test_forged_samples_gain_at_most_the_margin():
    # A runner claiming 10x faster than the parent's clock saw: the runtime is the host figure / 1.05.
    t = _timing(0.1, 1.0)
    assert math.isclose(eval_figures.bounded_runtime(_ev("cuda"), t), 1.0 / 1.05)
    t = _timing(0.1, 1.0)
    assert math.isclose(eval_figures.bounded_runtime(_ev("cpu", margin=0.0), t), 1.0)


def test_the_baseline_has_no_floor():
    t = {"runtime_ms": 0.5}   # no host estimate: the reference's own code, nothing to bound
    assert eval_figures.bounded_runtime(_ev("cuda"), t) == 0.5


def test_host_estimate_is_the_reference_plus_the_difference_of_the_fastest_rounds():
    dev = types.SimpleNamespace(clean_timing={"ref_round_s": 0.010}, baseline={"median_ms": 1.0})
    details = {"timing": {}, "reference_timing": {"runtime_ms": 1.0}}
    job = {"mode": "candidate", "timing": {"round_calls": 10}}
    # Candidate rounds 6, 6.1, 7 ms; the reference's 10, 10.2, 11 ms (1 ms per call, of which 0 ms is
    # bookkeeping: the reference runs 1.0 ms): the candidate's calls are 0.4 ms cheaper each, so it costs
    # 0.6 ms by the parent's clock, give or take twice the reference rounds' spread (the candidate's own
    # spread is its to inflate, so it does not count).
    eval_figures.host_rounds_details(_ev("cuda"), dev, job, [0.0061, 0.006, 0.007], [0.010, 0.0102, 0.011], details)
    t = details["timing"]
    assert math.isclose(t["host_ms_per_call"], 0.6) and math.isclose(t["host_noise_ms"], 2 * 0.0002 * 1e3 / 10)
    assert t["host_bookkeeping_ms"] == 0.0


def test_a_quarter_of_the_rounds_bookkeeping_counts_as_noise():
    # The reference runs 0.01 ms but its rounds take 0.07 ms per call: 0.06 ms of drawing and digests.
    dev = types.SimpleNamespace(clean_timing={"ref_round_s": 0.0007}, baseline={"median_ms": 0.01})
    details = {"timing": {}, "reference_timing": {"runtime_ms": 0.01}}
    job = {"mode": "candidate", "timing": {"round_calls": 10}}
    eval_figures.host_rounds_details(_ev("cuda"), dev, job, [0.0009], [0.0007], details)
    t = details["timing"]
    assert math.isclose(t["host_bookkeeping_ms"], 0.06) and math.isclose(t["host_noise_ms"], 0.015)
    assert math.isclose(t["host_ms_per_call"], 0.03)


def test_slowed_reference_rounds_are_capped_by_the_clean_ones():
    # Reference rounds made 5x slower during the candidate's run count as 1.1x the baseline-time ones on a
    # GPU (max_drift), as the paired reference itself does.
    dev = types.SimpleNamespace(clean_timing={"ref_round_s": 0.010}, baseline={"median_ms": 1.0})
    details = {"timing": {}, "reference_timing": {"runtime_ms": 1.0}}
    job = {"mode": "candidate", "timing": {"round_calls": 10}}
    eval_figures.host_rounds_details(_ev("cuda"), dev, job, [0.010], [0.050], details)
    assert math.isclose(details["timing"]["host_ms_per_call"], 1.0 + (0.010 - 0.011) * 1e3 / 10)


def test_an_honest_figure_within_the_margin_is_its_own():
    # Host rounds 3% above the events (bookkeeping noise, clocks in short bursts): the events stand.
    t = _timing(1.50, 1.545)
    assert eval_figures.bounded_runtime(_ev("cuda"), t) == 1.50 and "runner_runtime_ms" not in t


@given(st.floats(0.01, 10.0), st.floats(0.01, 10.0), st.floats(0.01, 10.0), st.floats(0.0, 1.0))
def test_speedup_comes_from_the_pair_capped_by_the_start(paired, start, runtime, drift):
    r = EvalResult("ok", correct=True, runtime_ms=runtime, details={"reference_timing": {"runtime_ms": paired}})
    eval_figures.paired_speedup(r, start, drift)
    assert math.isclose(r.baseline_ms, min(paired, start * (1 + drift)))
    assert math.isclose(r.speedup, r.baseline_ms / runtime)
    assert math.isclose(r.details["baseline_drift"], r.baseline_ms / start - 1)
    assert ("reference_capped_from_ms" in r.details) == (paired > start * (1 + drift))


def test_without_a_pair_the_start_baseline_counts():
    r = EvalResult("ok", correct=True, runtime_ms=2.0, details={})
    eval_figures.paired_speedup(r, 4.0, 0.1)
    assert r.baseline_ms == 4.0 and r.speedup == 2.0 and r.details["baseline_drift"] == 0.0


def test_the_mismatch_check_sees_the_uncapped_estimate():
    # Reference rounds slower than at the start (a busier host): the floor uses the capped rounds, the
    # mismatch check the measured ones, so an honest candidate is never called a cheat for it.
    dev = types.SimpleNamespace(clean_timing={"ref_round_s": 0.010}, baseline={"median_ms": 1.0})
    details = {"timing": {}, "reference_timing": {"runtime_ms": 1.0}}
    job = {"mode": "candidate", "timing": {"round_calls": 10}}
    eval_figures.host_rounds_details(_ev("cuda"), dev, job, [0.030], [0.030], details)
    t = details["timing"]
    assert math.isclose(t["host_ms_uncapped"], 1.0) and t["host_ms_per_call"] > t["host_ms_uncapped"]


@pytest.mark.parametrize("name", ["host_rounds", "timing_iters", "timing_blocks", "host_calls", "steady_passes"])
def test_options_that_would_leave_nothing_to_measure_are_refused(name):
    with pytest.raises(ValueError, match=name):
        Options(**{name: 0})


@pytest.mark.parametrize("name,value", [("max_drift", -1.0), ("host_margin", -0.5), ("host_margin", "x"),
                                        ("paired_reference", "no"), ("timing_iters", 2.5), ("lead_ms", None)])
def test_options_of_the_wrong_kind_or_sign_are_refused_by_name(name, value):
    with pytest.raises(ValueError, match=f"Options.{name}"):
        Options(**{name: value})


def test_default_options_and_device_defaults_are_accepted():
    Options()
    Options(max_drift=None, host_margin=0.0, paired_reference=False, max_jobs=4, peak_flops=1e15)


def test_on_the_cpu_the_rounds_cpu_time_bounds_the_runtime_too():
    # A loaded machine: the wall-clock rounds spread (reference 10 .. 18 ms), so their floor is loose; the
    # CPU time of the same rounds hardly moves (10.0, 10.1 ms), and the tighter bound counts.
    dev = types.SimpleNamespace(clean_timing={"ref_round_s": 0.010}, baseline={"median_ms": 1.0})
    details = {"timing": {"runtime_ms": 0.05}, "reference_timing": {"runtime_ms": 1.0}}
    job = {"mode": "candidate", "timing": {"round_calls": 10}}
    clocks = {"runner": [0.0101, 0.0100], "reference": [0.0101, 0.0100]}
    ev = _ev("cpu")
    eval_figures.host_rounds_details(ev, dev, job, [0.011, 0.017], [0.010, 0.018], details, clocks)
    t = details["timing"]
    assert math.isclose(t["host_cpu_ms_per_call"], 1.0) and math.isclose(t["host_cpu_noise_ms"], 0.02)
    assert t["host_noise_ms"] > 1.0   # the wall-clock estimate alone would leave no floor at all
    assert math.isclose(eval_figures.bounded_runtime(ev, t), 0.98 / 1.10)


@given(st.lists(st.floats(0.001, 1.0), min_size=0, max_size=20), st.integers(1, 6), st.integers(0, 8),
       st.floats(0.0, 0.2))
def test_more_host_rounds_only_while_the_reference_rounds_disagree(ref_rounds, least, extra, settle):
    from evaluate_kernel import evaluation as eval_run
    ev = types.SimpleNamespace(opts=Options(host_rounds=least, host_rounds_max=least + extra, host_settle=settle))
    more = eval_run._more_rounds(ev, len(ref_rounds), ref_rounds)
    if len(ref_rounds) < least:
        assert more
    elif len(ref_rounds) >= least + extra:
        assert not more
    elif len(ref_rounds) < 2:
        assert more   # nothing to compare yet
    else:
        a, b = sorted(ref_rounds)[:2]
        assert more == (b - a > settle * a)


def test_another_process_cpu_clock_counts_its_ended_threads():
    import subprocess
    import sys
    import time

    from evaluate_kernel import evaluation as eval_run
    code = ("import threading, time\n"
            "def spin():\n    t = time.process_time()\n    while time.process_time() - t < 0.2: pass\n"
            "th = threading.Thread(target=spin); th.start(); th.join(); print('done', flush=True); time.sleep(5)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "done"   # the spinning thread has ended
        clock = eval_run._process_clock_s(proc.pid)
        assert clock is not None and clock >= 0.2
    finally:
        proc.kill()
        proc.wait()
    time.sleep(0.1)
    assert eval_run._process_clock_s(proc.pid) is None   # gone: no figure, never a made-up one

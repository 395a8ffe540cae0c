"""The speedup from the parent's clock (evaluate_kernel.clock): pure functions, tested without workers."""
from __future__ import annotations

import math
import random

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from evaluate_kernel import clock
from evaluate_kernel.clock import Batch

ms = st.floats(min_value=1e-4, max_value=10.0, allow_nan=False)


def _batches(side: str, calls: list[float], n: int = 10, draw: float = 0.002, digest: float = 0.001,
             probe: float = 0.0) -> list[Batch]:
    return [Batch(side, n, draw=draw, calls=c, digest=digest, probe=probe) for c in calls]


@given(st.lists(ms, min_size=1, max_size=40))
def test_interval_holds_the_median_and_lies_within_the_data(xs):
    lo, hi = clock.median_interval(xs)
    assert min(xs) <= lo <= clock._median(xs) <= hi <= max(xs)


def test_interval_uses_the_binomial_order_statistics():
    xs = list(range(1, 11))   # k = 10: P(B <= 1) = 1.1% <= 2.5% < P(B <= 2) = 5.5%: the 2nd and 9th
    assert clock.median_interval([float(x) for x in xs]) == (2.0, 9.0)
    assert clock.median_interval([1.0, 2.0, 3.0, 4.0, 5.0]) == (1.0, 5.0)   # too few: the whole range


@given(st.floats(min_value=0.01, max_value=5.0), st.floats(min_value=0.05, max_value=20.0),
       st.integers(min_value=1, max_value=64))
def test_equal_work_reads_as_the_ratio_of_the_calls(ref_s, factor, n):
    """Bookkeeping the same on both sides cancels: the speedup is exactly the ratio of the calls."""
    refs = _batches("ref", [ref_s] * 5, n)
    cands = _batches("cand", [ref_s / factor] * 4, n)
    f = clock.figures(refs, cands)
    assert math.isclose(f.speedup, factor, rel_tol=1e-9)
    assert math.isclose(f.runtime_ms * factor, f.baseline_ms, rel_tol=1e-9)
    assert f.low == f.high == f.speedup and f.noise == 0.0


@given(st.floats(min_value=0.0, max_value=0.002), st.floats(min_value=1e-5, max_value=0.01),
       st.integers(min_value=2, max_value=2000), st.floats(min_value=0.2, max_value=20.0))
def test_a_batchs_fixed_cost_is_found_and_taken_off_both_sides(fixed, per_call, n, factor):
    """Batches that take fixed + n * per_call: the fixed part is recovered from batches of 1 and n calls,
    and once taken off, the speedup is the ratio of the calls themselves however short the batches (left
    on, it pulled a 2.58x kernel to 2.52x on batches of 11 calls)."""
    pairs = [(Batch("ref", 1, calls=fixed + per_call), Batch("ref", n, calls=fixed + n * per_call))] * 3
    assert math.isclose(clock.fixed_cost(pairs), fixed, rel_tol=1e-6, abs_tol=1e-12)
    assume(fixed <= n * per_call * min(1.0, 1 / factor))   # batches are sized so (cost_ms's floor aside)
    refs = _batches("ref", [fixed + n * per_call] * 5, n)
    cands = _batches("cand", [fixed + n * per_call / factor] * 4, n)
    assert math.isclose(clock.figures(refs, cands, fixed=fixed).speedup, factor, rel_tol=1e-6)
    if fixed > 1e-3 * n * per_call and factor > 1.01:
        assert clock.figures(refs, cands).speedup < factor   # without it: towards 1


@given(st.floats(min_value=0.0, max_value=0.002), st.floats(min_value=0.0, max_value=1.0),
       st.floats(min_value=1e-4, max_value=0.01), st.integers(min_value=1, max_value=8))
def test_a_batch_with_a_fixed_cost_of_its_own_has_that_taken_off_instead(fixed, share, per_call, n):
    """A batch cut for memory has only what a batch of no calls costs taken off (timing.py): never more
    than the figures' fixed cost, so the cut batch costs at least what it would have, never less."""
    own = fixed * share
    b = Batch("cand", n, calls=fixed + n * per_call, fixed=own)
    usual = clock.typical([b])
    cut = clock.cost_ms(b, usual, usual, fixed)
    assert math.isclose(cut, max(fixed - own + n * per_call, b.calls / 2) / n * 1e3, rel_tol=1e-9)
    assert cut >= clock.cost_ms(Batch("cand", n, calls=b.calls), usual, usual, fixed) - 1e-12


def test_a_fixed_cost_stays_within_zero_and_the_one_call_batch():
    """Noise that reads a negative fixed cost, or one larger than a whole batch of one call, is cut."""
    assert clock.fixed_cost([(Batch("ref", 1, calls=0.001), Batch("ref", 10, calls=0.02))]) == 0.0
    assert clock.fixed_cost([(Batch("ref", 10, calls=0.001), Batch("ref", 1, calls=0.002))]) == 0.002
    assert clock.fixed_cost([(Batch("ref", 3, calls=0.001), Batch("ref", 3, calls=0.002))]) == 0.0
    assert clock.fixed_cost([]) == 0.0


@given(st.floats(min_value=0.0, max_value=1.0), st.sampled_from(["draw", "digest", "probe"]))
def test_work_moved_into_bookkeeping_is_charged_in_full(moved_fraction, phase):
    """A candidate that does part of its calls while drawing, digesting or in a tail on the GPU gains
    nothing: the phase's excess over the reference's usual is added back to its calls."""
    calls = 0.020
    refs = _batches("ref", [calls] * 7)
    honest = clock.figures(refs, _batches("cand", [calls] * 6))
    cheat = _batches("cand", [calls * (1 - moved_fraction)] * 6)
    for b in cheat:
        setattr(b, phase, getattr(b, phase) + calls * moved_fraction)
    f = clock.figures(refs, cheat)
    assert math.isclose(f.speedup, honest.speedup, rel_tol=1e-9)


@given(st.floats(min_value=0.0, max_value=0.003))
def test_faster_bookkeeping_earns_nothing(saved):
    """A harness made faster than the harness (the same inputs from one generator call, say)."""
    refs = _batches("ref", [0.02] * 7, draw=0.003)
    fast = _batches("cand", [0.02] * 6, draw=0.003 - saved)
    assert math.isclose(clock.figures(refs, fast).speedup, 1.0, rel_tol=1e-9)


@settings(max_examples=30)
@given(st.integers(min_value=0, max_value=2**31 - 1), st.floats(min_value=0.1, max_value=3.0),
       st.floats(min_value=0.2, max_value=1.0))
def test_moved_work_gains_at_most_the_cut_of_the_medians(seed, draw_over_calls, share):
    """Work moved into a noisy phase, in every batch or in some: charged in full (the side's median moves,
    or those batches deviate from it). What is left to the cheat is the cut at zero of the honest medians'
    difference, shared by the honest twin and read off the same noise here."""
    rng = random.Random(seed)
    calls, k = 0.01, 40
    noise = [rng.uniform(0.8, 1.2) for _ in range(k)]   # the same draws for both: only the trick differs
    moved = [calls / 2 if rng.random() < share else 0.0 for _ in range(k)]
    refs = [Batch("ref", 10, draw=calls * draw_over_calls * rng.uniform(0.8, 1.2), calls=calls) for _ in range(k + 1)]

    def side(trick: bool) -> list[Batch]:
        return [Batch("cand", 10, draw=calls * draw_over_calls * noise[i] + moved[i] * trick,
                      calls=calls - moved[i] * trick) for i in range(k)]

    honest, cheat = clock.figures(refs, side(False)), clock.figures(refs, side(True))
    cut = max(0.0, clock.typical(refs[1:])["draw"] - clock.typical(side(False)[1:])["draw"])
    assert cheat.runtime_ms >= honest.runtime_ms - cut / 10 * 1e3 - 1e-9


@settings(max_examples=50)
@given(st.floats(min_value=0.5, max_value=2.0), st.integers(min_value=0, max_value=2**31 - 1))
def test_drift_that_moves_both_sides_cancels(true_speedup, seed):
    """The machine slows down steadily (or in steps): alternated pairs see it on both sides."""
    rng = random.Random(seed)
    step, at = rng.uniform(0.0, 0.5), rng.randrange(41)
    slow = [1.0 + 0.5 * i / 40 + step * (i >= at) for i in range(41)]
    refs = _batches("ref", [0.02 * slow[2 * i] for i in range(21)])
    cands = _batches("cand", [0.02 / true_speedup * slow[2 * i + 1] for i in range(20)])
    f = clock.figures(refs, cands)
    assert abs(f.speedup / true_speedup - 1) < 0.02


def test_warm_up_pair_does_not_count():
    refs = _batches("ref", [0.02] * 4)
    cands = _batches("cand", [1.0, 0.01, 0.01])   # a slow first batch (cold caches, allocations)
    f = clock.figures(refs, cands)
    assert f.pairs == 2 and math.isclose(f.speedup, 2.0)
    assert clock.figures(refs[:2], cands[:1]) is None


def test_stopping_rule():
    refs = _batches("ref", [0.02] * 9)
    noisy = _batches("cand", [0.02 * (1 + 0.1 * (-1) ** i) for i in range(8)])
    assert not clock.enough(clock.figures(refs, noisy), 0.005, 6)
    steady = _batches("cand", [0.01] * 8)
    assert clock.enough(clock.figures(refs, steady), 0.005, 6)
    assert not clock.enough(clock.figures(refs[:5], steady[:4]), 0.005, 6)   # too few pairs yet
    assert not clock.enough(None, 0.005, 6)


@given(ms, st.one_of(st.none(), ms), st.integers(min_value=1, max_value=1 << 30))
def test_calls_per_batch_bounds(ref_ms, cand_ms, per_call):
    n = clock.calls_per_batch(ref_ms, cand_ms, per_call, 20.0, 250.0, 4 << 30)
    assert n >= 1
    times = [t for t in (ref_ms, cand_ms) if t]
    if n > 1:
        assert n * max(times) <= 250.0 + 1e-9 and n * per_call <= 4 << 30
        assert n <= math.ceil(20.0 / min(times))


def test_calls_per_batch_sizes_for_the_faster_side():
    assert clock.calls_per_batch(1.0, 0.1, 1, 20.0, 250.0, 1 << 30) == 200     # 20 ms of the faster
    assert clock.calls_per_batch(1.0, 10.0, 1, 20.0, 250.0, 1 << 30) == 20     # 25 x 10 ms would pass 250
    assert clock.calls_per_batch(0.01, None, 1 << 20, 20.0, 250.0, 64 << 20) == 64   # memory-bound


def test_figures_need_alternation():
    import pytest
    with pytest.raises(ValueError):
        clock.figures(_batches("ref", [0.02] * 3), _batches("cand", [0.02] * 3))


@given(st.lists(st.floats(min_value=0.001, max_value=0.1), min_size=6, max_size=30),
       st.integers(min_value=0, max_value=2**31 - 1), st.floats(min_value=0.0, max_value=20.0))
def test_speedup_and_interval_are_finite_and_positive(calls, seed, book_over_calls):
    """Also where drawing and digesting take many times the calls and vary by more than the calls last
    (a 10 us call on a GPU): a batch whose bookkeeping ran fast still costs something."""
    assume(len(calls) % 2 == 1)
    rng = random.Random(seed)
    k = len(calls) // 2

    def side(name, xs):
        return [Batch(name, 10, calls=c, draw=c * book_over_calls * rng.uniform(0.3, 3.0),
                      digest=c * book_over_calls * rng.uniform(0.3, 3.0)) for c in xs]

    for b in side("ref", calls):
        assert clock.cost_ms(b, clock.typical([b]), clock.typical([b])) > 0
    f = clock.figures(side("ref", calls[:k + 1]), side("cand", calls[k + 1:]))
    assume(f is not None)
    for v in (f.speedup, f.low, f.high, f.runtime_ms, f.baseline_ms):
        assert math.isfinite(v) and v > 0


# ------------------------------------------------------------------------------------------ what the clock runs beside
def _fake_topology(root, siblings: dict[int, str]) -> None:
    for c, text in siblings.items():
        d = root / f"cpu{c}" / "topology"
        d.mkdir(parents=True)
        (d / "thread_siblings_list").write_text(text + "\n")


def test_physical_cores_group_smt_siblings(tmp_path):
    from evaluate_kernel.device import physical_cores
    _fake_topology(tmp_path, {c: f"{c % 8},{c % 8 + 8}" for c in range(16)})
    assert physical_cores(list(range(16)), str(tmp_path)) == [[c, c + 8] for c in range(8)]
    assert physical_cores([0, 1, 2, 9], str(tmp_path)) == [[0], [1, 9], [2]]   # siblings outside the set drop
    (tmp_path / "cpu20" / "topology").mkdir(parents=True)
    (tmp_path / "cpu20" / "topology" / "thread_siblings_list").write_text("20-21\n")
    assert physical_cores([20, 21, 30], str(tmp_path)) == [[20, 21], [30]]     # ranges; unreadable: alone


def test_a_runner_gets_a_whole_physical_core(tmp_path, monkeypatch):
    """The runner's SMT sibling takes no build, import or reference worker: a busy sibling slows the
    runner's host work (and so a small call's batches) by tens of percent for seconds at a time."""
    import types

    from evaluate_kernel import evaluator
    _fake_topology(tmp_path, {c: f"{c % 8},{c % 8 + 8}" for c in range(16)})
    monkeypatch.setattr(evaluator.os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    real = evaluator.physical_cores
    monkeypatch.setattr(evaluator, "physical_cores", lambda cores: real(cores, str(tmp_path)))
    for n_devices, k in ((1, 1), (2, 1), (2, 2)):
        plan = types.SimpleNamespace(opts=types.SimpleNamespace(cpu_threads=k, pin_cpus=True))
        evaluator.Evaluator._cpu_plan(plan, n_devices)
        assert plan.pinned
        runners = [c for cpus in plan._runner_cpus for c in cpus]
        assert len(runners) == n_devices * k and all(len(cpus) == k for cpus in plan._runner_cpus)
        idle = {c % 8 for c in runners}   # the physical cores the runners are on
        assert len(idle) == len(runners) and not any(c % 8 in idle for c in plan.other_cpus)
        assert len(plan.other_cpus) == 16 - 2 * len(runners)
    plan = types.SimpleNamespace(opts=types.SimpleNamespace(cpu_threads=1, pin_cpus=True))
    monkeypatch.setattr(evaluator.os, "sched_getaffinity", lambda pid: {0, 8}, raising=False)
    evaluator.Evaluator._cpu_plan(plan, 1)   # one physical core: nothing left for the others, so no pinning
    assert not plan.pinned


def test_no_collection_runs_while_batches_are_timed():
    """A collection of the whole heap is tens of milliseconds in a process with torch: off in either
    worker once a timing starts (and back in the reference worker afterwards), and in the parent while
    any of its evaluations times, however they overlap."""
    import gc

    import torch

    from evaluate_kernel import batches, timing
    was = gc.isenabled()
    try:
        gc.enable()
        batches.Batches(torch.nn.Identity(), {"get_inputs": lambda: [torch.randn(4)]}, torch.device("cpu"), False)
        assert not gc.isenabled()
        batches.release_collections()
        assert gc.isenabled() and gc.get_freeze_count() == 0
        hold = timing._NoCollections
        hold.hold()
        hold.hold()
        hold.release()
        assert not gc.isenabled()   # the other timing still runs
        hold.release()
        assert gc.isenabled()
    finally:
        gc.unfreeze()
        (gc.enable if was else gc.disable)()


def test_a_fixed_costs_spread_tells_steady_pairs_from_disturbed_ones():
    """The quartiles of the pairs' estimates over a whole batch: an H100's quiet baseline (0.5%) against
    one whose runner shared its core with the Evaluator's start-up (20%), as measured."""
    quiet = [(18.089, 5.219), (18.242, 5.157), (17.983, 5.221), (18.064, 5.15), (18.07, 5.181)]
    shared = [(19.131, 11.372), (16.511, 11.567), (18.817, 9.379), (23.176, 7.524), (13.611, 10.157)]

    def pairs(rows, n):
        return [(Batch("ref", n, calls=a / 1e3), Batch("ref", 1, calls=b / 1e3)) for a, b in rows]
    assert clock.fixed_cost_spread(pairs(quiet, 4)) < 0.01
    assert 0.15 < clock.fixed_cost_spread(pairs(shared, 3)) < 0.25
    assert clock.fixed_cost_spread(pairs(quiet[:1], 4)) == math.inf


# ------------------------------------------------------------------ the host's slow spells (GPU)

FAST, SLOW = 80e-6, 140e-6   # host loops seen on an H100's virtual machine in its fast and slow spells


@given(st.lists(st.one_of(st.none(), st.floats(min_value=1e-6, max_value=1e-2)), max_size=60))
def test_the_steady_loop_is_a_low_one_and_ignores_untimed_ones(loops):
    level = clock.steady_host(loops + [math.nan])
    timed = sorted(x for x in loops if x is not None)
    if not timed:
        assert level is None
    else:
        assert level in timed and level <= timed[len(timed) // 2]


def test_the_host_note_gives_each_sides_share_of_batches_begun_in_a_slow_spell():
    edge = FAST * (1 + clock.HOST_SLACK)
    batches = [Batch("ref", 1, host=h) for h in (FAST, SLOW, edge, None)] + \
        [Batch("cand", 1, host=h) for h in (SLOW, SLOW, FAST, FAST)]
    note = clock.host_note(batches, FAST)
    assert note == {"host_loop_steady_ms": 0.08, "host_slow_share": {"reference": 0.333, "candidate": 0.5}}
    assert clock.host_note(batches, None)["host_slow_share"] == {"reference": None, "candidate": None}


def test_the_host_loop_runs_on_the_runners_cores_and_leaves_this_threads_affinity_as_it_was():
    import os

    from evaluate_kernel import steps
    own = os.sched_getaffinity(0)
    seconds = steps.host_loop([max(own)])
    assert seconds is not None and 0 < seconds < 1
    assert os.sched_getaffinity(0) == own
    assert steps.host_loop([10 ** 6]) is None   # no such core: no figure, nothing moved
    assert os.sched_getaffinity(0) == own

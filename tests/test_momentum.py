"""momentum.py: worked examples by hand and property tests of §3.2 / Algorithm 2."""
import math
import random
from collections import Counter

import pytest
from hypothesis import given, settings, strategies as st

import momentum
from momentum import Momentum, absolute_progress, power_law_index, relative_progress

scores = st.floats(min_value=0.0, max_value=1e6, allow_nan=False, allow_infinity=False)


def test_five_step_trajectory_by_hand():
    # s_0 = 10 ms, target r = 0, beta = 0.85, m_0 = 1.0
    m = Momentum(initial_score=10.0, target=0.0)
    assert m.value == 1.0
    assert m.update(8.0) == pytest.approx(0.2)            # R = (10 - 8) / 10
    assert m.value == pytest.approx(0.85 * 1.0 + 0.15 * 0.2)          # 0.88
    assert m.update(9.0) == 0.0                           # worse than the best: no progress
    assert m.value == pytest.approx(0.748)
    assert m.update(None) == 0.0                          # a failed candidate
    assert m.value == pytest.approx(0.6358)
    assert m.update(6.0) == pytest.approx(0.25)           # R = (8 - 6) / (8 - 0)
    assert m.value == pytest.approx(0.85 * 0.6358 + 0.15 * 0.25)      # 0.57793
    assert m.update(6.0) == 0.0                           # a tie is not an improvement
    assert m.value == pytest.approx(0.4912405)
    assert m.best == 6.0 and m.updates == 5
    assert m.absolute == pytest.approx(0.4)               # A = (10 - 6) / 10


def test_failures_count_as_no_improvement_until_stagnant():
    m = Momentum(initial_score=3.5, target=0.0)
    # 0.85^n < 1e-3 first holds at n = 43 (ln 1e-3 / ln 0.85 = 42.5)
    for _ in range(42):
        m.update(math.inf)
        assert not m.stagnant
    m.update(float("nan"))
    assert m.stagnant
    m.reset()
    assert m.value == 1.0 and not m.stagnant
    assert m.best == 3.5


def test_defaults_are_the_official_ones():
    m = Momentum(initial_score=1.0)
    assert (m.beta, m.threshold, m.target) == (0.85, 1e-3, 0.0)
    assert momentum.POWER_ALPHA == 1.5


def test_relative_progress_edge_cases():
    assert relative_progress(10.0, 5.0, 0.0) == 0.5
    assert relative_progress(10.0, 10.0, 0.0) == 0.0           # tie
    assert relative_progress(10.0, 12.0, 0.0) == 0.0           # worse
    assert relative_progress(10.0, math.inf, 0.0) == 0.0       # failure
    assert relative_progress(10.0, float("nan"), 0.0) == 0.0
    assert relative_progress(1.0, 0.5, 1.0) == 0.0             # previous best already at the target
    assert relative_progress(1.0, 0.5, 2.0) == 0.0             # ... or past it
    assert relative_progress(10.0, 2.0, 5.0) == 1.0            # overshooting the target: clipped
    assert relative_progress(math.inf, 3.0, 0.0) == 1.0        # first real result


def test_absolute_progress_edge_cases():
    assert absolute_progress(4.0, 1.0, 0.0) == 0.75
    assert absolute_progress(4.0, 5.0, 0.0) == 0.0             # slower than the start
    assert absolute_progress(4.0, -1.0, 0.0) == 1.0            # past the target
    assert absolute_progress(4.0, math.inf, 0.0) == 0.0
    assert absolute_progress(2.0, 2.0, 2.0) == 1.0             # s_0 == r and reached
    assert absolute_progress(2.0, 3.0, 2.0) == 0.0


def test_bad_construction_is_refused():
    with pytest.raises(ValueError):
        Momentum(initial_score=math.inf)
    with pytest.raises(ValueError):
        Momentum(initial_score=1.0, beta=1.0)


def test_round_trip():
    m = Momentum(initial_score=3.0, target=0.5)
    m.update(2.0)
    again = Momentum.from_dict(m.to_dict())
    assert again == m


@given(prev=scores, best=scores, target=scores)
def test_relative_progress_in_unit_interval_above_target(prev, best, target):
    r = relative_progress(prev, best, target)
    assert 0.0 <= r <= 1.0
    if best >= target and prev > target and best < prev:
        assert r == pytest.approx((prev - best) / (prev - target))


@given(initial=scores, target=scores, b1=scores, b2=scores)
def test_absolute_progress_monotone_in_best(initial, target, b1, b2):
    lo, hi = sorted((b1, b2))
    a_lo, a_hi = absolute_progress(initial, lo, target), absolute_progress(initial, hi, target)
    assert 0.0 <= a_hi <= a_lo <= 1.0       # a lower (better) score never has less progress


@given(initial=st.floats(min_value=1e-3, max_value=1e3), steps=st.lists(
    st.one_of(st.none(), st.floats(min_value=0.0, max_value=2e3)), max_size=60),
    beta=st.floats(min_value=0.0, max_value=0.99))
def test_momentum_invariants(initial, steps, beta):
    m = Momentum(initial_score=initial, target=0.0, beta=beta)
    best = initial
    for s in steps:
        prev_value = m.value
        r = m.update(s)
        if s is not None and s < best:
            best = s
        assert m.best == best                     # the best so far, failures ignored
        assert 0.0 <= r <= 1.0
        assert 0.0 <= m.value <= 1.0
        assert m.value == pytest.approx(beta * prev_value + (1 - beta) * r)


@given(n=st.integers(min_value=1, max_value=50), alpha=st.floats(min_value=0.0, max_value=4.0),
       seed=st.integers(min_value=0, max_value=2**32))
def test_power_law_index_in_range_and_reproducible(n, alpha, seed):
    k = power_law_index(n, alpha, random.Random(seed))
    assert 0 <= k < n
    assert k == power_law_index(n, alpha, random.Random(seed))


def test_power_law_frequencies_favour_early_states():
    n, alpha, draws = 6, 1.5, 40_000
    rng = random.Random(1234)
    counts = Counter(power_law_index(n, alpha, rng) for _ in range(draws))
    weights = [(k + 1) ** -alpha for k in range(n)]
    total = sum(weights)
    for k in range(n):
        assert counts[k] / draws == pytest.approx(weights[k] / total, abs=0.01)
    assert counts[0] > counts[1] > counts[2]
    with pytest.raises(ValueError):
        power_law_index(0, 1.5, rng)

"""crossover.py: the action weights of App. B.3 and the three principles of §3.3."""
import random
from collections import Counter

import pytest
from hypothesis import given, strategies as st

from crossover import BACKTRACK, action_weights, choose_action

unit = st.floats(min_value=0.0, max_value=1.0)
partners = st.dictionaries(st.integers(min_value=0, max_value=20), unit, min_size=1, max_size=6)


def test_weights_by_hand_dominant_island():
    # Principle 1: A_i = 0.8 is ahead of both partners -> backtrack is favoured.
    w = action_weights(0.8, {1: 0.2, 2: 0.1})
    s = 1 - 0.6
    assert w[BACKTRACK] == pytest.approx(0.6 + s * 0.2 * 0.8)
    assert w[1] == pytest.approx(s * 0.8 * 0.2)   # only the synergy bonus
    assert w[2] == 0.0                             # a worse, non-best partner offers nothing
    assert w[BACKTRACK] / sum(w.values()) > 0.9


def test_weights_by_hand_shared_low_progress():
    # Principle 2: both islands similar and far from the target -> backtrack.
    w = action_weights(0.1, {7: 0.12})
    s = 1 - 0.02
    assert w[BACKTRACK] == pytest.approx(s * 0.9 * 0.88)
    assert w[7] == pytest.approx(0.02 + s * 0.1 * 0.12)
    assert w[BACKTRACK] > 10 * w[7]


def test_weights_by_hand_shared_high_progress():
    # Principle 3: both similar and close to the target -> cross over with the best partner.
    w = action_weights(0.9, {"a": 0.88, "b": 0.5})
    s = 1 - 0.02
    assert w[BACKTRACK] == pytest.approx(0.02 + s * 0.1 * 0.12)
    assert w["a"] == pytest.approx(s * 0.9 * 0.88)
    assert w["b"] == 0.0
    assert max(w, key=w.get) == "a"


def test_partner_ahead_gets_its_gap():
    w = action_weights(0.2, {1: 0.7, 2: 0.4})
    assert w[2] == pytest.approx(0.2)
    s = 1 - 0.5
    assert w[1] == pytest.approx(0.5 + s * 0.2 * 0.7)
    assert w[BACKTRACK] == pytest.approx(s * 0.8 * 0.3)


def test_no_partners_means_backtrack():
    assert action_weights(0.4, {}) == {BACKTRACK: 1.0}
    assert choose_action(0.4, {}, random.Random(0)) == BACKTRACK


def test_tie_for_best_partner_gives_bonus_to_first_listed():
    w = action_weights(0.5, {3: 0.6, 1: 0.6})
    assert w[3] > w[1] == pytest.approx(0.1)


def test_out_of_range_and_nan_inputs_are_clipped():
    assert action_weights(float("nan"), {1: 2.0}) == action_weights(0.0, {1: 1.0})
    assert action_weights(-1.0, {1: float("nan")}) == action_weights(0.0, {1: 0.0})


@given(a_i=unit, others=partners)
def test_weights_non_negative_with_positive_total(a_i, others):
    w = action_weights(a_i, others)
    assert set(w) == {BACKTRACK, *others}
    assert all(v >= 0.0 for v in w.values())
    assert sum(w.values()) > 0.0


@given(a_i=unit, others=partners)
def test_principle_dominance(a_i, others):
    a_best = max(others.values())
    w = action_weights(a_i, others)
    if a_i > a_best:
        assert w[BACKTRACK] >= a_i - a_best - 1e-12
        # crossing over with a worse island never has a base weight
        assert sum(v > 0 for k, v in w.items() if k != BACKTRACK) <= 1
    if a_i - a_best >= 0.5:
        assert w[BACKTRACK] / sum(w.values()) > 0.5


@given(a_i=st.floats(0.0, 0.3), delta=st.floats(-0.1, 0.1))
def test_principle_shared_low_progress_backtracks(a_i, delta):
    a_j = min(0.3, max(0.0, a_i + delta))
    w = action_weights(a_i, {1: a_j})
    assert w[BACKTRACK] > w[1]


@given(a_i=st.floats(0.7, 1.0), delta=st.floats(-0.1, 0.1), a_other=st.floats(0.0, 0.6))
def test_principle_shared_high_progress_crosses_over_with_best(a_i, delta, a_other):
    a_j = min(1.0, max(0.7, a_i + delta))
    w = action_weights(a_i, {1: a_j, 2: a_other})
    assert max(w, key=w.get) == 1


def test_sampling_frequencies_follow_the_weights():
    rng = random.Random(7)
    a_i, others = 0.3, {1: 0.5, 2: 0.35, 3: 0.1}
    w = action_weights(a_i, others)
    total = sum(w.values())
    draws = 40_000
    counts = Counter(choose_action(a_i, others, rng) for _ in range(draws))
    for action, weight in w.items():
        assert counts[action] / draws == pytest.approx(weight / total, abs=0.01)


def test_choice_is_reproducible_with_a_seed():
    picks = [choose_action(0.5, {1: 0.5, 2: 0.6}, random.Random(s)) for s in range(20)]
    again = [choose_action(0.5, {1: 0.5, 2: 0.6}, random.Random(s)) for s in range(20)]
    assert picks == again

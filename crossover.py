"""Self-adaptive collaborative evolution: choosing backtrack or crossover (paper §3.3, App. B.3).

When an island stagnates (momentum.py), it picks one intervention from
A = {Backtrack} ∪ {Crossover_j : j ≠ i}, sampled in proportion to weights built from absolute
progress A (Algorithm 2 lines 14-25):

    A_best = max_{j≠i} A_j,   S = max(0, 1 - |A_i - A_best|)                  lines 16-17
    w_BT   = max(0, A_i - A_best) + S (1 - A_i)(1 - A_best)                   line 18
    w_Cj   = max(0, A_j - A_i)              for every partner j               line 20
    w_Cj  += S A_i A_best                   for the best partner only         lines 21-22
    action ~ P(a) = w_a / sum of all weights                                  line 25

The three principles of §3.3 fall out of these terms:
1. a dominant island (A_i > every A_j) prefers to backtrack: only w_BT has the dominance term;
2. islands that are similar and both far from the target prefer to backtrack: the stagnation term
   S (1-A_i)(1-A_best) is large;
3. islands that are similar and both close to the target prefer to cross over with the best partner:
   the synergy bonus S A_i A_best is large.

Undefined cases, decided here: A values outside [0, 1] are clipped into it and NaN counts as 0
(momentum.absolute_progress already returns values in [0, 1]); no partners means the only action is
backtrack; ties for the best partner give the synergy bonus to the first of them in the order the
caller lists its partners (run.py lists islands by index), so results are reproducible. For A in
[0, 1] the total weight is always positive (if A_i > A_best then w_BT >= A_i - A_best; if A_i < A_best
then w_C_best >= A_best - A_i; if equal to a then w_BT + bonus = (1-a)^2 + a^2 > 0), so the
"all weights zero" fallback to backtrack exists only as a guard.

Standard library only.
"""
from __future__ import annotations

import math
import random
from typing import Hashable, Mapping

BACKTRACK = "backtrack"


def _clip01(a: float) -> float:
    if a is None or not isinstance(a, (int, float)) or math.isnan(a):
        return 0.0
    return min(1.0, max(0.0, float(a)))


def action_weights(a_self: float, a_others: Mapping[Hashable, float]) -> dict:
    """{"backtrack": w_BT, j: w_Cj for each partner j}, from this island's A_i and its partners' A_j."""
    a_i = _clip01(a_self)
    partners = {j: _clip01(a) for j, a in a_others.items()}
    if not partners:
        return {BACKTRACK: 1.0}
    j_best = max(partners, key=partners.__getitem__)   # first of equals wins: max keeps the first
    a_best = partners[j_best]
    similarity = max(0.0, 1.0 - abs(a_i - a_best))                        # S
    weights = {BACKTRACK: max(0.0, a_i - a_best)                          # dominance
               + similarity * (1.0 - a_i) * (1.0 - a_best)}              # low-progress stagnation
    for j, a_j in partners.items():
        weights[j] = max(0.0, a_j - a_i)                                  # w_Cj base
    weights[j_best] += similarity * a_i * a_best                          # synergy bonus
    return weights


def choose_action(a_self: float, a_others: Mapping[Hashable, float], rng: random.Random):
    """Sample "backtrack" or a partner id with P(a) ∝ w_a (Algorithm 2 line 25)."""
    weights = action_weights(a_self, a_others)
    actions = list(weights)
    total = sum(weights.values())
    if not total > 0.0:   # unreachable for A in [0, 1]; see the module docstring
        return BACKTRACK
    return rng.choices(actions, weights=[weights[a] for a in actions])[0]

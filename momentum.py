"""Momentum-based backtracking: the progress signals of PACEvolve (paper §3.2, first formula of §3.3).

This file is the bookkeeping half of Algorithm 2 (App. B.3):

    line 2       s_prev <- s_0,  m <- 1.0                      Momentum.__init__
    lines 3-4    s_best <- min(s_curr, s_prev)                 Momentum.update
    lines 5-10   R_t = (s_prev - s_best) / (s_prev - r)        relative_progress
    line 11      m_t = beta * m_{t-1} + (1 - beta) * R_t       Momentum.update
    line 13      trigger when m_t < eps_rel                    Momentum.stagnant
    line 14      A_t = (s_0 - s_best) / (s_0 - r)              absolute_progress
    line 27      revert to t' ~ PowerLaw                       power_law_index

The other half (which action to take once an island stagnates: lines 15-25) is in crossover.py, and
run.py wires both into the islands.

Scores are "lower is better" (for kernels: runtime in ms) and `target` is the lower bound r (0 ms by
default). Symbols follow the paper's Table 3: s_0 initial score, s_t best score at generation t,
r target, G_t = s_t - r the gap, R_t relative progress, m_t momentum, A_t absolute progress.

Default constants are the official code's (google/pacevolve `crossover_utils.py` and `run_experiment.py`):
beta = 0.85, eps_rel = 1e-3, power-law alpha = 1.5 (freeze period 15 lives in run.py).
Where the official code differs from the paper we follow the paper: momentum starts at 1.0 (Algorithm 2
line 2; the official scheduler starts at 0.0), a failed candidate counts as a generation without
improvement (the official code skips it, so a run of build failures never looks stagnant), and
momentum is reset to 1.0 after a backtrack or crossover (the official code never resets it).

Standard library only, so the module can be copied into any project.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

BETA = 0.85          # momentum decay beta (official default)
THRESHOLD = 1e-3     # stagnation threshold eps_rel (official default)
POWER_ALPHA = 1.5    # power-law exponent for backtracking (official default)


def _finite(x: float | None) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


def relative_progress(prev_best: float, best: float, target: float) -> float:
    """R_t = (G_{t-1} - G_t) / G_{t-1} = (prev_best - best) / (prev_best - target), in [0, 1].

    Undefined cases, decided here:
    - no improvement (best >= prev_best), or a non-finite best (a failed candidate): 0.
    - the previous best already at or past the target (G_{t-1} <= 0): 0. There is no gap left to
      close, so no progress can be measured relative to it (the official code does the same).
    - a best that overshoots the target (best < target): clipped to 1, "the whole gap was closed".
    - a non-finite prev_best (nothing scored yet) with a finite best: 1, the first real result closes
      an unbounded gap as far as this formula can tell. Momentum never hits this case because s_0 is
      finite, but callers of this function might.
    """
    if not _finite(best) or not (best < prev_best):
        return 0.0
    if not _finite(prev_best):
        return 1.0
    gap = prev_best - target
    if gap <= 0.0:
        return 0.0
    return min(1.0, (prev_best - best) / gap)


def absolute_progress(initial: float, best: float, target: float) -> float:
    """A_t = (s_0 - s_best) / (s_0 - r), clipped to [0, 1] (§3.3).

    A is compared across islands and feeds weights that must stay non-negative, so it is clipped:
    a best worse than the start counts as 0, a best past the target as 1. Undefined cases: a
    non-finite best is 0 (nothing achieved); s_0 == r (or s_0 < r: nothing to close) gives 1 when
    the best reaches the target and 0 otherwise.
    """
    if not _finite(best) or not _finite(initial):
        return 0.0
    gap = initial - target
    if gap <= 0.0:
        return 1.0 if best <= target else 0.0
    return min(1.0, max(0.0, (initial - best) / gap))


@dataclass
class Momentum:
    """An island's relative-improvement momentum m_t (§3.2, Algorithm 2 lines 2-13).

    `update` takes the newest evaluated score of each generation (None, NaN or inf for a failed
    candidate), keeps the best score so far and returns R_t.
    """

    initial_score: float          # s_0
    target: float = 0.0           # r
    beta: float = BETA
    threshold: float = THRESHOLD  # eps_rel
    value: float = 1.0            # m_t; 1.0 at the start (Algorithm 2 line 2)
    best: float | None = None     # s_best so far; starts at s_0
    updates: int = 0

    def __post_init__(self) -> None:
        if not _finite(self.initial_score):
            raise ValueError(f"initial score s_0 must be a finite number, got {self.initial_score!r}")
        if not 0.0 <= self.beta < 1.0:
            raise ValueError(f"beta must be in [0, 1), got {self.beta!r}")
        if self.best is None:
            self.best = float(self.initial_score)

    def update(self, score: float | None) -> float:
        """Record one generation's score; returns R_t and updates m_t = beta*m_{t-1} + (1-beta)*R_t."""
        s_prev = self.best
        s_curr = score if _finite(score) else math.inf     # a failure never improves the best
        s_best = min(s_curr, s_prev)                        # line 4
        r_t = relative_progress(s_prev, s_best, self.target)  # lines 5-10
        self.value = self.beta * self.value + (1.0 - self.beta) * r_t  # line 11
        self.best = s_best                                  # line 12: s_prev <- s_best
        self.updates += 1
        return r_t

    @property
    def stagnant(self) -> bool:
        """Line 13: the island has stopped making relative progress (m_t < eps_rel)."""
        return self.value < self.threshold

    @property
    def absolute(self) -> float:
        """A_t of this island (line 14)."""
        return absolute_progress(self.initial_score, self.best, self.target)

    def reset(self) -> None:
        """Forget the slow-down after an intervention, so the island gets a fresh run-up."""
        self.value = 1.0

    def to_dict(self) -> dict:
        return dict(initial_score=self.initial_score, target=self.target, beta=self.beta,
                    threshold=self.threshold, value=self.value, best=self.best, updates=self.updates)

    @classmethod
    def from_dict(cls, d: dict) -> "Momentum":
        return cls(**d)


def power_law_weights(n: int, alpha: float = POWER_ALPHA) -> list[float]:
    """Unnormalised P(k) ∝ (k + 1)^(-alpha) for k = 0..n-1: state 0 (the oldest) weighs most."""
    if n <= 0:
        raise ValueError(f"need at least one state to go back to, got n={n}")
    return [(k + 1) ** (-alpha) for k in range(n)]


def power_law_index(n: int, alpha: float, rng: random.Random) -> int:
    """An index in [0, n) with P(k) ∝ (k + 1)^(-alpha) (Algorithm 2 line 27).

    Index 0 is the earliest saved state, so earlier iterations are favoured, as the paper says the
    backtrack "reverts to an earlier state sampled from a power-law distribution that favours earlier
    iterations". alpha = 0 is uniform; larger alpha goes back further more often.
    """
    return rng.choices(range(n), weights=power_law_weights(n, alpha))[0]

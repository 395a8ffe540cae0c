"""The runtime and the speedup, from the parent's own clock: pure functions over the phases it timed.

A batch is n calls of one model (the candidate's in its runner, the reference in the reference worker) on
n input sets drawn from one seed, run by the same code on both sides (batches.py). The parent sends each
step and reads its own clock when it sends and when the answer arrives:

    draw    "draw" -> "drawn"       the worker draws the n input sets            bookkeeping
    calls   "go" -> "done"          n calls back to back, outputs kept, one sync the work
    settle  (GPU) after "done": until a trivial kernel of a third context runs   bookkeeping
            at once (work still running on any stream shows up here)
    digest  "digest" -> "digests"   a digest of every output (the commitment)    bookkeeping
    probe   (GPU) after the digests, the runner stopped: until the GPU is idle   bookkeeping

On the CPU a batch has one phase, the calls: the runner's inputs are written into its memory and its
outputs read from it while it is stopped (host_batches.py), so its bookkeeping phases are zero on both
sides and a batch's cost is its calls. On a GPU with shared memory the same, and two phases more: settle
(before "go", the inputs written: until the device is idle) and probe (after the stop); a runner that says
"done" before its work is over leaves the rest to the probe. On a GPU a batch's cost is its calls plus, for each bookkeeping phase, the phase's deviation from its side's
median plus how much longer that median is than the reference's (never shorter):

    cost = calls - fixed + sum over phases of (phase - median of the side) + max(0, median of the side - median of the reference)
    (never below half the calls: see cost_ms)

So work moved out of the calls into drawing, settling, digesting or a tail on the GPU is charged in full:
in every batch (its median moves) or in the batches it went to (their deviation). A side whose
bookkeeping is faster than the reference's (the harness's code replaced by a faster one: the same inputs
from one generator call, say) gains nothing: the shift is cut at zero. Honest noise is a deviation around
the side's own median, zero on average, on both sides alike; only the cut of the medians' difference
leaves a bias, about 0.4 of that difference's noise, which shrinks with the number of batches. (Cutting
each batch's excess at zero instead charged each side the upper half of its noise and spared a cheat whose
moved work lifted a phase above it: 4-8% on a GPU softmax whose draw and digest take five times its
calls. Crediting shorter phases down to the reference's shortest paid a faster harness the reference's
spread: 1.15x.) cost_ms = that / n.

The clock: on a GPU the parent's monotonic clock; on the CPU the worker's own CPU time (all its threads)
from the moment it is let go to the moment it is stopped, read by the parent from the kernel with the
worker stopped (a running thread's time is brought up to
date only at scheduler events), so a busy neighbour that takes the core adds nothing (the runner may
not start processes there: confine.py).

A batch also costs a fixed amount besides its calls, the same whatever it holds: on a GPU with shared
memory, waking the stopped runner, the GPU switching back to its context from the prober's, the last
synchronise and the answer, 0.7-0.9 ms on an H100. Left in, it is 4% of a 20 ms batch and pulls every
speedup towards 1 (a 2.58x kernel read 2.52x with 11 calls a batch, 2.32x with 2). fixed_cost() finds it
from the reference's batches of one call and of n (the baseline's run, timing.py), and cost_ms takes it
off every batch of either side.

Batches alternate r0 c0 r1 c1 ... c(k-1) rk; candidate batch i sits between reference batches i and i+1
(the second one on some of the same inputs, the checked calls' among them, so its kept outputs check the
candidate's; each side's batch has a length of its own, n, about batch_ms of its calls), so a machine
that drifts moves both sides of every pair alike. ratio(i) = mean(cost(r_i), cost(r_i+1)) / cost(c_i); the speedup
is the median of the ratios, with a distribution-free 95% interval from their order statistics; the
runtime and baseline are the medians of the per-call costs. Pair 0 is a warm-up and does not count.

On a GPU each batch also carries the time of a loop of the parent's own, run on the runners' core just
before it (Batch.host): a diagnostic of the host's slow spells (host_note; DESIGN.md, "The host's slow
spells"). Every pair still counts, slow spells or not.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

PHASES = ("draw", "calls", "settle", "digest", "probe")
HOST_SLACK = 0.25   # a batch whose host loop took this much longer than the steady one began in a slow spell
BOOKKEEPING = ("draw", "settle", "digest", "probe")


@dataclass
class Batch:
    side: str                  # "ref" or "cand"
    n: int                     # calls in the batch
    draw: float = 0.0          # seconds, by the parent's clock
    calls: float = 0.0
    settle: float = 0.0
    digest: float = 0.0
    probe: float = 0.0
    fixed: float | None = None  # seconds taken off besides its calls, where not the figures' own (cut batches)
    host: float | None = None   # (GPU) seconds of the parent's loop on the runners' core just before it


@dataclass
class Figures:
    speedup: float
    low: float                 # the speedup's 95% interval
    high: float
    runtime_ms: float          # the candidate's cost per call (median over its batches)
    baseline_ms: float         # the reference's, measured beside it
    pairs: int
    ratios: list[float] = field(default_factory=list)

    @property
    def noise(self) -> float:
        """The interval's relative half-width."""
        return (self.high - self.low) / 2 / self.speedup


def typical(batches: list[Batch]) -> dict[str, float]:
    """What each bookkeeping phase typically takes a side: the median over its batches."""
    return {p: _median([getattr(b, p) for b in batches]) for p in BOOKKEEPING}


def cost_ms(b: Batch, own: dict[str, float], ref: dict[str, float], fixed: float = 0.0) -> float:
    """A batch's cost per call: its calls less the batch's fixed cost (`fixed`, seconds: measured on the
    reference's runner, fixed_cost(); b.fixed instead where set: a batch cut for memory, timing.py), each
    phase's deviation from its side's median (own), and the amount by which that median exceeds the
    reference's (ref), never less than zero. Never less than
    half the batch's calls either: where bookkeeping takes several times the calls (a 10 us call on a
    GPU), a batch whose bookkeeping ran unusually fast would otherwise cost nothing or less, and a ratio
    of such costs is no speedup (an honest candidate was rejected for it). The floor only raises costs,
    on both sides alike."""
    extra = sum(getattr(b, p) - own[p] + max(0.0, own[p] - ref[p]) for p in BOOKKEEPING)
    fixed = fixed if b.fixed is None else b.fixed
    return max(b.calls - fixed + extra, b.calls / 2) / b.n * 1e3


def fixed_cost(pairs: list[tuple[Batch, Batch]]) -> float:
    """Seconds a batch costs besides its calls (waking the stopped runner, the GPU switching back to its
    context, the last synchronise and the answer), from pairs of the reference's batches of two sizes,
    n1 < n2, on the assumption that a batch takes fixed + n * per_call: the median over the pairs of
    (n2 * t1 - n1 * t2) / (n2 - n1), within [0, the smaller batch's median time]."""
    est = _fixed_estimates(pairs)
    if not est:
        return 0.0
    return min(max(0.0, _median([e for e, _, _ in est])), _median([small for _, small, _ in est]))


def fixed_cost_spread(pairs: list[tuple[Batch, Batch]]) -> float:
    """How far the pairs' estimates of the fixed cost disagree: the distance between their quartiles, as a
    fraction of the larger batches' median time (inf without two estimates). A device or core shared with
    other work while they ran spreads them: 20% on one core shared with an Evaluator's start-up, where a
    quiet H100 gave 0.5-3%."""
    est = _fixed_estimates(pairs)
    big = _median([b for _, _, b in est]) if est else 0.0
    if len(est) < 2 or big <= 0:
        return math.inf
    values = sorted(e for e, _, _ in est)
    q = (len(values) - 1) // 4
    return (values[-1 - q] - values[q]) / big


def figures(refs: list[Batch], cands: list[Batch], skip: int = 1, fixed: float = 0.0) -> Figures | None:
    """The speedup from alternated batches (refs has one more than cands, r_i before c_i before r_i+1);
    the first `skip` pairs are warm-up; `fixed`, every batch's fixed cost (seconds). None while no pair
    counts yet."""
    if len(refs) != len(cands) + 1:
        raise ValueError(f"{len(refs)} reference batches around {len(cands)} candidate batches")
    if len(cands) <= skip:
        return None
    ref_usual, cand_usual = typical(refs[skip:]), typical(cands[skip:])
    ref_costs = [cost_ms(b, ref_usual, ref_usual, fixed) for b in refs]
    ratios, cand_costs = [], []
    for i in range(skip, len(cands)):
        c = cost_ms(cands[i], cand_usual, ref_usual, fixed)
        cand_costs.append(c)
        ratios.append((ref_costs[i] + ref_costs[i + 1]) / 2 / c)
    low, high = median_interval(ratios)
    return Figures(speedup=_median(ratios), low=low, high=high, runtime_ms=_median(cand_costs),
                   baseline_ms=_median([ref_costs[i] for i in range(skip, len(refs))]), pairs=len(ratios),
                   ratios=ratios)


def steady_host(loops: list[float | None], quantile: float = 0.1) -> float | None:
    """The host loop's steady time: a low quantile of the loops timed so far (a loop is only ever slowed,
    by a slow spell, an interrupt, a cold cache, never sped up; a quantile rather than the least, so that
    one loop on a briefly faster core does not make every later one look slow). None without any."""
    s = sorted(x for x in loops if x is not None and math.isfinite(x) and x > 0)
    return s[int(quantile * (len(s) - 1))] if s else None


def host_note(batches: list[Batch], steady: float | None) -> dict:
    """What a timing's batches say of the host: the steady loop (ms) and the share of the batches whose
    loop took more than HOST_SLACK longer (begun in a slow spell), each side's."""
    def share(side: str) -> float | None:
        timed = [b.host for b in batches if b.side == side and b.host is not None]
        if not timed or steady is None:
            return None
        return round(sum(h > steady * (1 + HOST_SLACK) for h in timed) / len(timed), 3)
    return {"host_loop_steady_ms": None if steady is None else round(steady * 1e3, 4),
            "host_slow_share": {"reference": share("ref"), "candidate": share("cand")}}


def median_interval(xs: list[float], confidence: float = 0.95) -> tuple[float, float]:
    """A distribution-free interval for the median: order statistics j and k+1-j (1-based), j the largest
    with P(Binomial(k, 1/2) < j) <= (1 - confidence) / 2; the whole range when k is too small for that."""
    s = sorted(xs)
    k = len(s)
    if k == 0:
        return math.nan, math.nan
    tail, j, below = (1 - confidence) / 2, 0, 0.0
    while j < k // 2:
        below += math.comb(k, j) / 2 ** k   # P(B = j) added: P(B <= j) = P(B < j + 1)
        if below > tail:
            break
        j += 1
    j = max(j, 1)
    return s[j - 1], s[k - j]


def enough(f: Figures | None, target: float, min_pairs: int) -> bool:
    """Stop timing once min_pairs count and the interval is within target (relative half-width)."""
    return f is not None and f.pairs >= min_pairs and f.noise <= target


def calls_per_batch(ref_ms: float, cand_ms: float | None, bytes_per_call: int, batch_ms: float,
                    max_batch_ms: float, batch_bytes: int) -> int:
    """Enough calls that the faster side's batch lasts batch_ms (fixed costs of a batch, a few exchanges
    of messages, then stay ~1% of it); no more than keep the slower side's under max_batch_ms or the
    batch's inputs and outputs under batch_bytes (every call gets inputs of its own); at least one."""
    times = [t for t in (ref_ms, cand_ms) if t is not None and math.isfinite(t) and t > 0]
    if not times:
        return 1
    n = math.ceil(batch_ms / min(times))
    n = min(n, math.floor(max_batch_ms / max(times)), batch_bytes // max(1, bytes_per_call))
    return max(1, n)


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    if not s:
        return math.nan
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def _fixed_estimates(pairs: list[tuple[Batch, Batch]]) -> list[tuple[float, float, float]]:
    """Each pair of unequal sizes' estimate of the fixed cost, with its smaller and larger batch's time."""
    out = []
    for a, b in pairs:
        (a, b) = (a, b) if a.n < b.n else (b, a)
        if a.n < b.n:
            out.append(((b.n * a.calls - a.n * b.calls) / (b.n - a.n), a.calls, b.calls))
    return out

"""The confirmed ranking: which of two measured programs is faster when every measurement is noisy.

A speedup is the reference's per-call time measured beside the candidate, in the same evaluation,
divided by the candidate's; on a shared machine two evaluations of one program can differ by far more
than two good programs do. So a candidate takes the title (an island's best, the run's best) from the
incumbent only when the evidence says it is faster:

    verdict(challenger, incumbent)
        NOT_FASTER     its speedup is not above the incumbent's: no re-measurement is spent on it
        FASTER         ln(S_c / S_i) > sqrt(h_c^2 + h_i^2): the gap is wider than the two measurements'
                       combined 95% noise (h = relative half-width of a speedup's 95% interval)
        HEAD_TO_HEAD   ahead by less, or a noise is unknown: both are measured again, alternately
                       (`alternation`: incumbent, challenger, challenger, incumbent, ...), and
    settle(challenger_runs, incumbent_runs)
                       decides on those re-measurements alone: the challenger wins when the geometric mean
                       of its speedups is above the incumbent's. Both then carry the re-measured figures
                       (`combine`), so every score the search uses agrees with the verdicts given.

Re-measurements alone decide a head-to-head because the challenger's first figure is the one that made
it look better: it is biased upwards (the winner's curse), and the incumbent's may be too.

`Figures` are one program's measured figures: the speedup, its noise, the program's and the reference's
per-call times, and how many evaluations they summarise. `describe` is how they read in prompts, the
console and the report; `LEGEND` says once what such a line means. `Ledger` keeps a search's figures
and duels: it takes the re-measurement as a plain callable, so the rule can be tested with any scripted
evaluator. Pure functions over floats, standard library only.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Callable

FASTER, NOT_FASTER, HEAD_TO_HEAD = "faster", "not_faster", "head_to_head"
HEAD_TO_HEAD_ROUNDS = 2   # re-measurements of each side in a head-to-head (ABBA: drift in time cancels)

LEGEND = ("A result reads 'S x ±N% (A ms vs reference B ms beside it)': A and B are the program's and the "
          "PyTorch reference's per-call times, measured side by side in one evaluation; S is the speedup "
          "estimated from them (about B / A; higher is better) and ±N% its 95% noise band. Differences "
          "inside the noise bands are not evidence that a change helped or hurt.")


@dataclass(frozen=True)
class Figures:
    """One program's measured figures (or the combination of several evaluations of it)."""
    speedup: float                   # over the reference timed beside it; higher is better
    noise: float | None = None       # relative half-width of the speedup's 95% interval; None: unknown
    runtime_ms: float | None = None  # the program's per-call time, measured
    baseline_ms: float | None = None  # the reference's per-call time, measured beside it
    samples: int = 1                 # evaluations these figures summarise

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Figures:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def figures_of(result: dict, s0: float) -> Figures | None:
    """The figures of one evaluator result (EvalResult.to_dict()), None when it is not a correct, timed
    candidate. The noise comes from details["noise"], else from details["speedup_ci"] = [lo, hi]; an
    evaluator that gives neither leaves it unknown. Without a paired speedup the runtime is compared with
    s_0, the reference's time measured at the start, and no reference time is claimed beside it."""
    if result.get("status") != "ok" or not _positive(result.get("runtime_ms")):
        return None
    details = result.get("details") or {}
    speedup = result.get("speedup")
    paired = _positive(speedup)
    if not paired:
        speedup = s0 / result["runtime_ms"]
    noise = details.get("noise")
    if not (_finite(noise) and noise >= 0):
        ci = details.get("speedup_ci")
        noise = None
        if isinstance(ci, (list, tuple)) and len(ci) == 2 and all(_positive(x) for x in ci) and ci[0] <= ci[1]:
            noise = (ci[1] - ci[0]) / 2 / speedup
    baseline = result.get("baseline_ms") if paired and _positive(result.get("baseline_ms")) else None
    return Figures(float(speedup), None if noise is None else float(noise), float(result["runtime_ms"]),
                   None if baseline is None else float(baseline))


def verdict(challenger: Figures, incumbent: Figures) -> str:
    """FASTER, NOT_FASTER or HEAD_TO_HEAD (module docstring)."""
    if not challenger.speedup > incumbent.speedup:
        return NOT_FASTER
    if challenger.noise is None or incumbent.noise is None:
        return HEAD_TO_HEAD
    gap = math.log(challenger.speedup / incumbent.speedup)
    return FASTER if gap > math.hypot(challenger.noise, incumbent.noise) else HEAD_TO_HEAD


def alternation(rounds: int = HEAD_TO_HEAD_ROUNDS) -> list[str]:
    """The order of a head-to-head's evaluations: "incumbent", "challenger", "challenger", "incumbent",
    ... (`rounds` of each), so a machine getting steadily busier or quieter favours neither."""
    pair = ["incumbent", "challenger"]
    return [who for k in range(rounds) for who in (pair if k % 2 == 0 else pair[::-1])]


def settle(challenger_runs: list[Figures | None], incumbent_runs: list[Figures | None]) -> bool:
    """True when the challenger wins the head-to-head: the geometric mean of its re-measured speedups is
    above the incumbent's. A failed re-measurement (None) is left out; a side with none left loses (the
    challenger when both have none: the title stays)."""
    mine, theirs = [f for f in challenger_runs if f], [f for f in incumbent_runs if f]
    if not mine:
        return False
    if not theirs:
        return True
    return combine(mine).speedup > combine(theirs).speedup


def combine(runs: list[Figures]) -> Figures:
    """The figures of several evaluations of one program: geometric means of the speedups and times
    (ratios average in logs), and the noise of that mean when every run's noise is known,
    sqrt(sum h^2) / k (independent measurements); unknown otherwise."""
    if not runs:
        raise ValueError("combine needs at least one measurement")
    noises = [r.noise for r in runs]
    noise = None if any(n is None for n in noises) else math.sqrt(sum(n * n for n in noises)) / len(runs)
    return Figures(_geomean([r.speedup for r in runs]), noise, _geomean([r.runtime_ms for r in runs]),
                   _geomean([r.baseline_ms for r in runs]), sum(r.samples for r in runs))


def describe(f: Figures) -> str:
    """How figures read everywhere a result is shown, e.g. "1.42x ±6% (0.4964 ms vs reference 0.7049 ms
    beside it)"; "noise not measured" when the evaluator gave none."""
    band = f"±{f.noise:.0%}" if f.noise is not None and f.noise >= 0.005 else (
        f"±{f.noise:.1%}" if f.noise is not None else "noise not measured")
    times = (f"{f.runtime_ms:.4g} ms vs reference {f.baseline_ms:.4g} ms beside it" if f.baseline_ms
             else f"{f.runtime_ms:.4g} ms" if f.runtime_ms else "")
    if f.samples > 1:
        times += ("; " if times else "") + f"mean of {f.samples} evaluations"
    return f"{f.speedup:#.3g}x {band}" + (f" ({times})" if times else "")


@dataclass
class Ledger:
    """A search's confirmed figures, program by program, and every duel fought (JSON round trip:
    to_dict / from_dict). A program's first measurement is its figures until a head-to-head
    re-measures it; the reference is not in the ledger: its speedup is 1 by definition, its time s_0."""
    s0: float                                            # the reference's time measured at the start
    figures: dict[str, dict] = field(default_factory=dict)
    duels: dict[str, dict] = field(default_factory=dict)  # "challenger>incumbent" -> verdict, crowned, runs
    rounds: int = HEAD_TO_HEAD_ROUNDS   # re-measurements of each side; 0 trusts single measurements

    def note(self, pid: str, result: dict) -> Figures | None:
        """Records a program's first measurement (a later one of the same program changes nothing) and
        returns its figures, None when the result is not a correct, timed candidate."""
        fig = figures_of(result, self.s0)
        if fig is not None:
            self.figures.setdefault(pid, fig.to_dict())
        return self.get(pid) if fig is not None else None

    def get(self, pid: str) -> Figures | None:
        return Figures.from_dict(self.figures[pid]) if pid in self.figures else None

    def score(self, pid: str) -> float | None:
        """The program's score for the search: the run's s_0 / its confirmed speedup (lower is better)."""
        fig = self.get(pid)
        return self.s0 / fig.speedup if fig else None

    def confirm(self, challenger: str, incumbent: str,
                remeasure: Callable[[str, str], dict | None]) -> tuple[bool, dict | None]:
        """Returns (whether the challenger takes the title, the duel when a head-to-head was just fought).
        `remeasure(pid, tag)` evaluates a program once more (EvalResult.to_dict()); `tag` names the
        measurement uniquely, so a caller can store and replay it. An exception from it ends the
        head-to-head undecided: it propagates and nothing is recorded. A pair is judged once: asked
        again, the ledger answers from its record."""
        key = f"{challenger}>{incumbent}"
        if challenger == incumbent:
            return False, None
        if key in self.duels:
            return self.duels[key]["crowned"], None
        result = verdict(self.get(challenger), self.get(incumbent))
        duel = {"verdict": result, "crowned": result == FASTER or (result == HEAD_TO_HEAD and not self.rounds)}
        if result == HEAD_TO_HEAD and self.rounds:
            runs: dict[str, list] = {challenger: [], incumbent: []}
            for k, who in enumerate(alternation(self.rounds), start=1):
                pid = challenger if who == "challenger" else incumbent
                measured = remeasure(pid, f"head-to-head {key} #{k}")
                runs[pid].append(figures_of(measured, self.s0) if measured else None)
            duel["crowned"] = settle(runs[challenger], runs[incumbent])
            for pid, figs in runs.items():
                if any(figs):
                    self.figures[pid] = combine([f for f in figs if f]).to_dict()
            duel["runs"] = {pid: [f and f.to_dict() for f in figs] for pid, figs in runs.items()}
        self.duels[key] = duel
        return duel["crowned"], duel if "runs" in duel else None

    def text(self, pid: str | None) -> str:
        """A program's result as everything shows it (describe); the reference's for pid None."""
        if pid is None:
            return f"the reference itself: {self.s0:.4g} ms per call, measured at the start (1x by definition)"
        return describe(self.figures_or_raise(pid))

    def figures_or_raise(self, pid: str) -> Figures:
        fig = self.get(pid)
        if fig is None:
            raise KeyError(f"no figures for program {pid}")
        return fig

    def standing(self, pid: str) -> str:
        """How the program stands against the reference: "faster", "within noise" (its band reaches
        1x), "not faster" or "faster, noise not measured"."""
        fig = self.get(pid)
        if fig.speedup <= 1.0:
            return "not faster"
        if fig.noise is None:
            return "faster, noise not measured"
        return "faster" if math.log(fig.speedup) > fig.noise else "within noise"

    def summary(self, pid: str) -> dict:
        """The figures a run's best carries in the checkpoint: its score (runtime_ms: s_0 / speedup) and
        what was measured."""
        f = self.figures_or_raise(pid)
        return {"runtime_ms": self.s0 / f.speedup, "speedup": f.speedup, "noise": f.noise,
                "measured_ms": f.runtime_ms, "baseline_ms": f.baseline_ms, "evaluations": f.samples}

    def to_dict(self) -> dict:
        return {"figures": self.figures, "duels": self.duels}

    @classmethod
    def from_dict(cls, s0: float, d: dict, rounds: int = HEAD_TO_HEAD_ROUNDS) -> Ledger:
        return cls(s0, dict(d.get("figures", {})), dict(d.get("duels", {})), rounds)


def measured(result: dict) -> dict:
    """An evaluation's own figures as events.jsonl keeps them: both times, the speedup and its noise."""
    d = result.get("details") or {}
    return {"measured_ms": result.get("runtime_ms"), "baseline_ms": result.get("baseline_ms"),
            "speedup": result.get("speedup"), "noise": d.get("noise"), "speedup_ci": d.get("speedup_ci")}


def _geomean(xs: list[float | None]) -> float | None:
    if not xs or any(not _positive(x) for x in xs):
        return None
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _positive(x) -> bool:
    return _finite(x) and x > 0

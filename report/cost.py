"""What a run's LLM calls cost, for report.md and report.html: per model, per candidate, per improvement of
the run's best, and which models the main role called over the rounds (the ensemble's draws, or the
bandit's choices; driver/models.py).

    cost = Cost.load(run_dir)     # spend.json (the ledger), events.jsonl, checkpoint.json
    cost.markdown()               # report.md's section, [] when there is nothing to say
    cost.html()                   # report.html's section, "" likewise
    generation_cost(event)        # "$0.0123: cheap 2, strong 1" for a generation event (a candidate's card)

Where the numbers come from: spend.json holds every call the run made, in every session (the probes, and
the calls of a round cut short by a stop, which the resumed run made again, included); each generation
event holds the dollars of its island's calls since its previous generation (the crossover prune before it
included) and its main-role calls per model; the checkpoint holds the bandit's statistics. An improvement
is a generation whose candidate became the run's best (faster than the reference and every earlier one); its
cost is what all islands spent since the previous improvement. Standard library only (and driver/models.py, itself
standard library only).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from html import escape
from pathlib import Path

from driver.models import usd

MAX_BUCKETS = 12       # columns of rounds in the table of choices


@dataclass
class Improvement:
    round: int
    island: int
    program: str
    runtime_ms: float
    models: dict
    usd: float | None           # its generation's calls
    since: float | None         # every island's calls since the previous improvement, this one's included
    so_far: float | None        # every generation's calls up to this one


@dataclass
class Cost:
    ledger: dict
    generations: list[dict]
    stats: dict                 # the checkpoint's models state: kind, stats per model
    s0: float | None
    improvements: list[Improvement] = field(default_factory=list)

    @classmethod
    def load(cls, run_dir) -> "Cost":
        run_dir = Path(run_dir)
        ledger = _json(run_dir / "spend.json") or {}
        checkpoint = _json(run_dir / "checkpoint.json") or {}
        gens = []
        try:
            for line in (run_dir / "events.jsonl").read_text(errors="replace").splitlines():
                try:
                    e = json.loads(line)
                except ValueError:
                    continue
                if isinstance(e, dict) and e.get("type") == "generation":
                    gens.append(e)
        except OSError:
            pass
        return cls.of(ledger, gens, checkpoint.get("models") or {}, checkpoint.get("baseline_ms"))

    @classmethod
    def of(cls, ledger: dict, generations: list[dict], stats: dict, s0: float | None) -> "Cost":
        cost = cls(ledger, generations, stats, s0)
        best, since, so_far = s0 or float("inf"), 0.0, 0.0   # the reference is the first best
        for e in generations:
            usd = e.get("usd")
            since = None if since is None or usd is None else since + usd
            so_far = None if so_far is None or usd is None else so_far + usd
            ms = e.get("runtime_ms")
            if isinstance(ms, (int, float)) and ms < best:
                best = ms
                cost.improvements.append(Improvement(e.get("round", 0), e.get("island", 0), e.get("program") or "",
                                                     ms, e.get("models") or {}, usd, since, so_far))
                since = 0.0
        return cost

    @property
    def worth_showing(self) -> bool:
        """A model that costs money, a budget, or several main models: else the section says nothing new."""
        priced = any(p and (p[0] or p[1]) for p in (self.ledger.get("prices") or {}).values())
        several = len((self.stats.get("stats") or {})) > 1
        return bool(self.ledger) and (priced or several or bool(self.ledger.get("cap_usd")))

    # -- the tables, as rows of plain text ------------------------------------------------------------

    def headline(self) -> str:
        cap = self.ledger.get("cap_usd")
        return usd(self.ledger.get("total_usd") or 0.0) + (f" of a {usd(cap)} budget" if cap else "")

    def summary(self) -> str:
        total = self.ledger.get("total_usd") or 0.0
        calls = sum(int(m.get("calls") or 0) for m in (self.ledger.get("models") or {}).values())
        search = _sum(e.get("usd") for e in self.generations)
        cap = self.ledger.get("cap_usd")
        text = (f"{usd(total)} for {calls} LLM calls (every call made, in every session)"
                + (f", of a budget of {usd(cap)}" if cap else ""))
        if search is not None and total - search > 1e-9:
            text += (f"; the search's generations {usd(search)}, the other {usd(total - search)} went to the "
                     f"probes and to calls of rounds cut short by a stop (made again on resume)")
        unpriced = [m for m, p in (self.ledger.get("prices") or {}).items() if p is None]
        if unpriced:
            text += f"; {', '.join(unpriced)} unpriced (tokens only)"
        return text

    def model_rows(self) -> tuple[list[str], list[list[str]]]:
        head = ["model", "price in/out (US$ per M tokens)", "calls", "input tokens", "output tokens", "US$",
                "main-role calls", "gain", "gain per $"]
        stats = self.stats.get("stats") or {}
        prices = self.ledger.get("prices") or {}
        rows = []
        for m, t in (self.ledger.get("models") or {}).items():
            s = stats.get(m) or {}
            p = prices.get(m)
            rows.append([m, f"{p[0]:g}/{p[1]:g}" if p else "unpriced", f"{t.get('calls', 0):,}",
                         f"{t.get('input', 0):,}", f"{t.get('output', 0):,}", usd(t.get("usd")),
                         f"{s['calls']:,}" if s else "-", f"{s['gain']:.3f}" if s else "-",
                         f"{s['gain'] / s['usd']:.3g}" if s and s.get("usd") else "-"])
        return head, rows

    def improvement_rows(self) -> tuple[list[str], list[list[str]]]:
        head = ["round", "island", "program", "speedup", "written by (main-role calls)", "its generation",
                "spent since the previous best", "spent so far"]
        rows = [[str(i.round), str(i.island), i.program,
                 f"{self.s0 / i.runtime_ms:.3f}x" if self.s0 else f"{i.runtime_ms:.4g} ms", _calls(i.models),
                 usd(i.usd), usd(i.since), usd(i.so_far)] for i in self.improvements]
        return head, rows

    def candidate_line(self) -> str:
        costs = sorted(e["usd"] for e in self.generations
                       if e.get("program") and isinstance(e.get("usd"), (int, float)))
        if not costs:
            return ""
        return (f"a generation that produced a candidate cost {usd(sum(costs) / len(costs))} on average "
                f"(median {usd(costs[len(costs) // 2])}, most {usd(costs[-1])}, {len(costs)} candidates)")

    def choice_rows(self) -> tuple[list[str], list[list[str]]]:
        """Main-role calls per model over buckets of rounds: the draws or the bandit's choices."""
        per_round: dict[int, dict[str, int]] = {}
        for e in self.generations:
            for m, n in (e.get("models") or {}).items():
                bucket = per_round.setdefault(int(e.get("round") or 0), {})
                bucket[m] = bucket.get(m, 0) + int(n)
        names = list((self.stats.get("stats") or {}) or {m: 0 for r in per_round.values() for m in r})
        names += sorted({m for r in per_round.values() for m in r} - set(names))
        if len(names) < 2 or not per_round:
            return [], []
        rounds = sorted(per_round)
        width = -(-len(rounds) // MAX_BUCKETS)
        rows = []
        for k in range(0, len(rounds), width):
            chunk = rounds[k:k + width]
            counts = {m: sum(per_round[r].get(m, 0) for r in chunk) for m in names}
            total = sum(counts.values()) or 1
            label = f"{chunk[0]}" if len(chunk) == 1 else f"{chunk[0]}-{chunk[-1]}"
            rows.append([label] + [f"{counts[m]} ({100 * counts[m] / total:.0f}%)" for m in names])
        kind = {"ucb": "the bandit's choices (--model-choice ucb)",
                "weights": "the ensemble's draws (--model-choice weights)"}.get(self.stats.get("kind"), "")
        return ["round" + (f": {kind}" if kind else "")] + names, rows

    # -- report.md and report.html ------------------------------------------------------------------

    def markdown(self) -> list[str]:
        if not self.worth_showing:
            return []
        out = ["", "## LLM cost", "", f"- spent: {self.summary()}"]
        line = self.candidate_line()
        if line:
            out.append(f"- per candidate: {line}")
        for title, (head, rows) in (("Per model (spend.json; gain: the improvements on their parents the "
                                     "model's main-role calls shared):", self.model_rows()),
                                    ("What each improvement of the best cost:", self.improvement_rows()),
                                    ("Main-role calls per model, by round:", self.choice_rows())):
            if rows:
                out += ["", title, "", "| " + " | ".join(head) + " |",
                        "|" + "|".join("---" if k == 0 else "---:" for k in range(len(head))) + "|"]
                out += ["| " + " | ".join(r) + " |" for r in rows]
        return out

    def html(self) -> str:
        if not self.worth_showing:
            return ""
        parts = [f"<p>{escape(self.summary())}." + (f" Per candidate: {escape(self.candidate_line())}."
                                                      if self.candidate_line() else "") + "</p>"]
        for title, (head, rows) in (("Per model", self.model_rows()),
                                    ("What each improvement of the best cost", self.improvement_rows()),
                                    ("Main-role calls per model, by round", self.choice_rows())):
            if rows:
                parts.append(f"<h3>{title}</h3><table><tr>" + "".join(f"<th>{escape(h)}</th>" for h in head)
                             + "</tr>" + "".join("<tr>" + "".join(
                                 (f'<td><a href="#p-{escape(c)}">{escape(c)}</a></td>' if head[k] == "program" and c
                                  else f"<td{' class=n' if k and c[:1] in '0123456789$-<' else ''}>{escape(c)}</td>")
                                 for k, c in enumerate(r)) + "</tr>" for r in rows) + "</table>")
        return "\n".join(parts)


def generation_cost(event: dict | None) -> str:
    """A generation's dollars and main-role calls per model ("" for a run without this accounting)."""
    if not event or "usd" not in event:
        return ""
    return usd(event.get("usd")) + (f": {_calls(event['models'])}" if event.get("models") else "")


def _calls(models: dict) -> str:
    return ", ".join(f"{m} {n}" for m, n in models.items())


def _sum(values) -> float | None:
    total = 0.0
    for v in values:
        if v is None:
            return None
        total += v
    return total


def _json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None

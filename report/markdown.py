"""report.md and progress.png: what a run did, for a person to read at the end (or after Ctrl-C).

    write_report(search, why)   # report.md (+ progress.png), from the search state and events.jsonl

report.md says why the run stopped, the best program with its measured times, speedup and noise band
(or that nothing beat the reference), wall time (summed over resumes), evaluations per status and the
head-to-heads that confirmed the ranking, LLM calls, tokens, failures per error class and replies that
could not be parsed per prompt kind, tokens per island, LLM calls and tokens per purpose (from the
transcript, driver/transcript.py), a replay's comparison with its recording, what the LLM calls cost
(report/cost.py: per model, per candidate, per improvement of the best, the models chosen over the
rounds), per island its best and best-so-far trajectory, and the interventions with the weights that
chose them. progress.png has three panels on one generation axis: every correct evaluation as a point
with each island's best-so-far line, the interventions on the island where they happened and the
reference at 1.0x; the failed evaluations in a band of their own (a row per island: x incorrect, | other
failures); each island's momentum m_t in its own lane with eps_rel (log scale for a small eps_rel, as in
report.html); the legend sits below, outside the panels. `progress_data` computes what is drawn, from the
events alone, so it can be checked without
looking at pixels.
"""
from __future__ import annotations

import statistics
from pathlib import Path

from driver import transcript
from driver.rundir import hardware_name, write_atomic
from report import chart as report_chart
from report import cost as report_cost
from report.data import calls_text

LINESTYLES = ["-", "--", "-.", ":"]
MARKERS = {"backtrack": "v", "crossover": "*"}


def write_report(search, why: str, wall_s: float | None = None) -> Path:
    """report.md in the run directory; `wall_s` defaults to the search's own total."""
    rd, s0 = search.rundir, search.s0
    wall_s = search.wall_seconds() if wall_s is None and hasattr(search, "wall_seconds") else wall_s or 0.0
    lines = [f"# pacevolve run: {search.task.name}", "",
             f"- stopped: {why} after {search.round} {_plural(search.round, 'round')} "
             f"(wall time {wall_s / 60:.1f} min, all sessions)",
             f"- device: {hardware_name(search.device)}",
             f"- reference (s_0): {s0:.4g} ms; target r: {target_text(search.target)}"]
    lines.append("- " + best_summary(search.global_best, s0, _text(search, (search.global_best or {}).get("program"))))
    for name, u in search.state()["usage"].items():
        if u:
            lines.append(f"- LLM {name}: {calls_text(u)}, "
                         f"{u.get('prompt_tokens', 0):,} prompt + {u.get('completion_tokens', 0):,} output "
                         f"tokens, {u.get('retries', 0)} retried")
    watch = getattr(search, "llm_watch", None)
    if watch is not None:
        failures = sum(watch.by_class.values())
        lines.append("- LLM failures: " + (", ".join(f"{k} {v}" for k, v in sorted(watch.by_class.items()))
                                           if failures else "none"))
        if watch.tokens:
            lines.append("- tokens per island: " + ", ".join(
                f"island {k} {v:,}" for k, v in sorted(watch.tokens.items(), key=lambda kv: int(kv[0]))))
    lines.append("- " + unusable_summary(getattr(search, "unusable", {})))
    evals = search.evals   # driver/evaluations.py
    lines.append("- evaluations: " + (", ".join(f"{k} {v}" for k, v in sorted(evals.counts.items()))
                                      or "none") + f"; CPU/GPU seconds checking and timing: {evals.seconds:.1f}")
    drift = drift_summary(evals.drifts)
    if drift:
        lines.append("- " + drift)
    replayed = getattr(evals.evaluator, "replay_summary", None)
    if callable(replayed):
        lines.append(f"- replay of {search.cfg.replay}: {replayed()}")
    cost = report_cost.Cost.load(rd.path)
    if cost.worth_showing:
        lines.append(f"- LLM cost: {cost.headline()} (section LLM cost below)")
    events = rd.events()
    ledger = getattr(search, "ledger", None)
    lines.append("- " + duel_summary([e for e in events if e.get("type") == "head_to_head"],
                                     evals.remeasured, ledger.rounds if ledger else 0))
    actions = [a for island in search.islands for a in island.actions]
    if actions:
        lines.append("- " + weights_summary(actions))
    lines += purpose_table(transcript.read(rd.path))
    eps = getattr(getattr(search, "cfg", None), "eps_rel", None)
    if plot_progress(progress_data(events, s0), search.task.name, rd.path / "progress.png", eps):
        lines += ["", "![every evaluation and the best so far per island](progress.png)"]
    lines += cost.markdown()
    lines += ["", "## Islands", ""]
    for island in search.islands:
        best = island.best
        lines.append(f"### Island {island.index}: best "
                     + (f"{_text(search, best.id)}, program `{best.id}`" if best else "none"))
        lines += ["", "| generation | island best: speedup over the reference (confirmed) |", "|---:|---:|"]
        step = max(1, len(island.trajectory) // 25)
        for g, ms in island.trajectory[::step] + island.trajectory[-1:] * (step > 1):
            lines.append(f"| {g} | {s0 / ms:.3f}x |")
        if island.actions:
            lines += ["", "Interventions (Algorithm 2):", ""]
            for a in island.actions:
                what = (f"backtrack to snapshot {a['restored_index']}" if a["action"] == "backtrack"
                        else f"crossover with island {a['partner']}")
                lines.append(f"- generation {a['generation']}: {what} (A_i={a['A_self']:.3f}, "
                             f"weights " + ", ".join(f"{k}={v:.3f}" for k, v in a["weights"].items())
                             + ")")
        lines.append("")
    path = rd.path / "report.md"
    write_atomic(path, "\n".join(lines) + "\n")
    return path


def target_text(target: float) -> str:
    """The target r as report.md states it: r = 0 is the default, not a missing figure."""
    return f"{target:.4g} ms" if target else "0 ms (no --target-speedup: progress counts toward 0 ms)"


def best_summary(best: dict | None, s0: float, text: str | None = None) -> str:
    """One line on the best program: what beat the reference, or that nothing did. `text` is its
    figures as ranking.describe writes them (measured times, speedup, noise band)."""
    if not best:
        return "no correct candidate yet"
    text = text or f"{best['runtime_ms']:.4g} ms, {best['speedup']:.3f}x"
    if best["runtime_ms"] < s0:
        return (f"**best: {text}** (island {best['island']}, generation {best['generation']}, `best.py`); "
                f"the reference measured {s0:.4g} ms at the start")
    return (f"**nothing beat the reference ({s0:.4g} ms at the start)**; the fastest correct candidate, "
            f"{text}, slower, is in `best.py`")


def best_header(task: str, hardware: str, s0: float, best: dict, text: str, standing: str) -> str:
    """The comment lines that open best.py: the task, the figures measured (ranking.describe) and, when
    the program is not shown to beat the reference (ranking.Ledger.standing), that it is not."""
    verdict = {"not faster": "\n# NOT FASTER than the reference: nothing correct has beaten it yet; this is the "
                             "fastest correct candidate found",
               "within noise": "\n# within the noise of the reference: not shown to be faster than it"}
    return (f"# pacevolve best for task {task} on {hardware}: {text}; the reference measured {s0:.4g} ms at "
            f"the start{verdict.get(standing, '')}\n"
            f"# island {best['island']}, generation {best['generation']}, program {best['program']}\n")


def duel_summary(duels: list[dict], remeasured: int, rounds: int = 2) -> str:
    """How the ranking was confirmed: head-to-heads fought, how many the challenger won, evaluations spent."""
    if not rounds:
        return "head-to-heads: off (--head-to-head 0: a candidate ahead on one measurement took the title)"
    if not duels:
        return ("head-to-heads: none (every change of an island's or the run's best was wider than the "
                "measured noise, or there was none)")
    won = sum(bool(d.get("crowned")) for d in duels)
    return (f"head-to-heads: {len(duels)} (the challenger took the title in {won}, the incumbent kept it in "
            f"{len(duels) - won}), {remeasured} {_plural(remeasured, 'evaluation')} spent re-measuring")


def unusable_summary(counts: dict[str, int]) -> str:
    """LLM replies that could not be parsed, per prompt kind (each got a format reminder, or was one's answer)."""
    if not any(counts.values()):
        return "LLM replies that could not be parsed: none"
    total = sum(counts.values())
    return (f"LLM replies that could not be parsed: {total} (" +
            ", ".join(f"{k} {v}" for k, v in sorted(counts.items()) if v) + ")")


def weights_summary(actions: list[dict]) -> str:
    """What the interventions were and the weights that chose them: with r = 0 and islands close together
    the crossover weights stay small, and the report says so."""
    kinds = [a["action"] for a in actions]
    cross = [sum(v for k, v in a["weights"].items() if k != "backtrack") / max(1e-12, sum(a["weights"].values()))
             for a in actions]
    return (f"interventions: {kinds.count('backtrack')} {_plural(kinds.count('backtrack'), 'backtrack')}, "
            f"{kinds.count('crossover')} {_plural(kinds.count('crossover'), 'crossover')}; the probability "
            f"of a crossover at each was {min(cross):.3f} to {max(cross):.3f} (median "
            f"{statistics.median(cross):.3f}): it grows with how far a partner island is ahead (A_j - A_i) "
            f"and, for islands alike, with how close both are to the target r")


def _text(search, pid: str | None) -> str | None:
    """A program's figures as the search shows them (None for a search without them)."""
    fn = getattr(search, "_metric_text", None)
    try:
        return fn(pid) if fn and pid else None
    except (KeyError, TypeError, ZeroDivisionError):
        return None


def purpose_table(reading) -> list[str]:
    """report.md's lines on the transcript: calls and tokens per purpose (none without a transcript)."""
    totals = transcript.totals(reading)
    if not totals:
        return []
    out = ["", "LLM calls per purpose (transcript.jsonl; `python -m driver.transcript DIR N` prints call N):", "",
           "| purpose | calls | failed | format reminders | prompt tokens | output tokens | seconds |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    for purpose, t in sorted(totals.items(), key=lambda kv: -kv[1]["calls"]):
        out.append(f"| {purpose} | {t['calls']} | {t['failed']} | {t['reminders']} | {t['input']:,} | "
                   f"{t['output']:,} | {t['latency_s']:.1f} |")
    return out


def progress_data(events: list[dict], s0: float) -> dict:
    """What progress.png draws, from events.jsonl: every evaluation as a point, each island's best-so-far
    speedup per generation, the interventions on their island's line, each island's momentum."""
    points, lines, marks, moms = [], {}, [], {}
    for e in events:
        if e.get("type") == "generation":
            island, gen = e["island"], e["generation"]
            if isinstance(e.get("momentum"), (int, float)):
                moms.setdefault(island, []).append((gen, e["momentum"]))
            attempts = e.get("attempts")
            if attempts is None:   # older events: only the generation's last outcome
                attempts = [{"status": e["outcome"], "score": e.get("runtime_ms")}] if e.get("outcome") else []
            for a in attempts:
                kind = ("correct" if a["status"] == "ok" and a.get("score") else
                        "incorrect" if a["status"] == "incorrect" else "failed")
                points.append({"island": island, "generation": gen, "kind": kind,
                               "speedup": s0 / a["score"] if kind == "correct" else None})
            if e.get("island_best_ms"):   # every line starts at generation 0, the reference
                lines.setdefault(island, [(0, 1.0)]).append((gen, s0 / e["island_best_ms"]))
        elif e.get("type") == "action":
            marks.append({"island": e["island"], "generation": e["generation"], "action": e["action"]})
    for m in marks:
        y = dict(lines.get(m["island"], [])).get(m["generation"])
        m["speedup"] = y if y is not None else 1.0
    return {"points": points, "lines": lines, "interventions": marks, "momentum": moms, "reference": 1.0}


def plot_progress(data: dict, title: str, path: Path, eps_rel: float | None = None) -> bool:
    """Draw `progress_data` to a PNG; False when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:
        return False
    fig = progress_figure(data, title, eps_rel)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def progress_figure(data: dict, title: str, eps_rel: float | None = None):
    """The matplotlib figure of progress.png."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    islands = sorted(set(data["lines"]) | {p["island"] for p in data["points"]} | set(data.get("momentum", {})))
    n = max(1, len(islands))
    fig = plt.figure(figsize=(9, 4.6 + 0.95 * n), layout="constrained")
    grid = fig.add_gridspec(2 + n, 1, height_ratios=[4.0, 0.28 * n + 0.25] + [0.75] * n)
    ax = fig.add_subplot(grid[0])
    band = fig.add_subplot(grid[1], sharex=ax)
    lanes = [fig.add_subplot(grid[2 + k], sharex=ax) for k in range(n)]
    ax.axhline(data["reference"], color="grey", linewidth=1, linestyle=":", zorder=1)
    floor = report_chart.momentum_floor(eps_rel)
    for k, island in enumerate(islands):
        colour = colours[k % len(colours)]
        # coinciding lines stay apart: each island has its own style and a thinner line than the one
        # below it; its points sit slightly to the side of the generation they belong to
        dx = (k - (n - 1) / 2) * 0.3 / n
        line = data["lines"].get(island, [])
        if line:
            ax.step([g for g, _ in line], [y for _, y in line], where="post", color=colour,
                    linestyle=LINESTYLES[k % len(LINESTYLES)], linewidth=3.0 - 2.0 * k / n, zorder=3)
        mine = [p for p in data["points"] if p["island"] == island]
        ok = [p for p in mine if p["kind"] == "correct"]
        ax.scatter([p["generation"] + dx for p in ok], [p["speedup"] for p in ok], s=18, color=colour, alpha=0.7)
        for kind, marker in (("incorrect", "x"), ("failed", "|")):
            bad = [p for p in mine if p["kind"] == kind]
            if bad:
                band.scatter([p["generation"] + dx for p in bad], [k] * len(bad), marker=marker, s=34, color=colour)
        for m in data["interventions"]:
            if m["island"] == island:
                ax.plot(m["generation"], m["speedup"], MARKERS.get(m["action"], "o"), color=colour,
                        markersize=11, markeredgecolor="black")
        lane = lanes[k]
        mom = data.get("momentum", {}).get(island, [])
        if mom:
            lane.plot([g for g, _ in mom], [max(floor, m) for _, m in mom], color=colour, linewidth=1.5)
        if floor:
            lane.set_yscale("log")
        lane.set_ylim(floor or 0.0, 1.05 if not floor else 1.3)
        if eps_rel:
            lane.axhline(eps_rel, color="grey", linewidth=1, linestyle="--")
        lane.set_ylabel(f"m_t {island}", fontsize=8, color=colour)
        lane.tick_params(labelsize=7)
    band.set_ylim(-0.6, n - 0.4)
    band.set_yticks(range(n), [f"island {i}" for i in islands], fontsize=7)
    band.set_ylabel("failed", fontsize=8)
    band.set_facecolor("#fbf3f2")
    for a in [ax, band] + lanes[:-1]:
        a.tick_params(labelbottom=False)
    lanes[-1].xaxis.set_major_locator(MaxNLocator(integer=True))
    lanes[-1].set_xlabel("generation")
    ax.set_ylabel("speedup over the reference")
    ax.set_title(f"{title}: every evaluation, the best so far, momentum", fontsize=10)
    handles = [Line2D([], [], color=colours[k % len(colours)], linestyle=LINESTYLES[k % len(LINESTYLES)],
                      linewidth=2, label=f"island {island} best so far") for k, island in enumerate(islands)]
    handles += [Line2D([], [], color="grey", linestyle=":", label="reference (1.0x)"),
                Line2D([], [], color="grey", marker="o", linestyle="", label="correct"),
                Line2D([], [], color="grey", marker="x", linestyle="", label="incorrect"),
                Line2D([], [], color="grey", marker="|", linestyle="", markersize=10, label="other failure"),
                Line2D([], [], color="grey", marker="v", markeredgecolor="black", linestyle="", label="backtrack"),
                Line2D([], [], color="grey", marker="*", markeredgecolor="black", linestyle="", markersize=10,
                       label="crossover")]
    if eps_rel:
        handles.append(Line2D([], [], color="grey", linestyle="--", label=f"eps_rel = {eps_rel:g}"))
    fig.legend(handles=handles, loc="outside lower center", ncols=min(5, len(handles)), fontsize=8, frameon=False)
    return fig


def drift_summary(drifts: list[float]) -> str:
    """How far the reference timed beside each candidate (whose ratio is the speedup) was from s_0."""
    if not drifts:
        return ""
    ordered = sorted(drifts)
    mid = statistics.median(ordered)
    return (f"reference drift (timed beside each candidate vs s_0): median {mid:+.1%}, from {ordered[0]:+.1%} "
            f"to {ordered[-1]:+.1%} over {len(drifts)} {_plural(len(drifts), 'evaluation')}: the machine's "
            "load moved this much between evaluations; each speedup is measured against the reference timed "
            "beside it, and its noise band (not the drift) says how far one evaluation can be trusted")


def _plural(n: int, word: str) -> str:
    return word if n == 1 else word + "s"

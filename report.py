"""report.md and progress.png: what a run did, for a person to read at the end (or after Ctrl-C).

    write_report(search, why)   # report.md (+ progress.png), from the search state and events.jsonl

report.md says why the run stopped, the best program (or that nothing beat the reference), wall time (summed
over resumes), evaluations per status, LLM calls, tokens and failures per error class, tokens per island, LLM
calls and tokens per purpose (from the transcript, transcript.py), a replay's comparison with its recording,
what the LLM calls cost (report_cost.py: per model, per candidate, per improvement of the best, the models
chosen over the rounds), and per island its best-so-far trajectory and interventions. progress.png has three
panels on one generation axis: every correct evaluation as a point with each island's best-so-far line, the
interventions on the island where they happened and the reference at 1.0x; the failed evaluations in a band of
their own (a row per island: x incorrect, | other failures); each island's momentum m_t in its own lane with
eps_rel (log scale for a small eps_rel, as in report.html); the legend sits below, outside the panels.
`progress_data` computes what is drawn, from the events alone, so it can be checked without
looking at pixels.
"""
from __future__ import annotations

from pathlib import Path

import report_chart
import report_cost
import transcript
from rundir import hardware_name, write_atomic

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
             f"- reference (s_0): {s0:.4g} ms; target r: {search.target:.4g} ms"]
    lines.append("- " + best_summary(search.global_best, s0))
    for name, u in search.state()["usage"].items():
        if u:
            lines.append(f"- LLM {name}: {u.get('calls', 0)} {_plural(u.get('calls', 0), 'call')}, "
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
    lines.append("- evaluations: " + (", ".join(f"{k} {v}" for k, v in sorted(search.eval_counts.items()))
                                      or "none") + f"; CPU/GPU seconds checking and timing: "
                                                   f"{search.eval_seconds:.1f}")
    drift = drift_summary(getattr(search, "drifts", []))
    if drift:
        lines.append("- " + drift)
    replayed = getattr(getattr(search, "evaluator", None), "replay_summary", None)
    if callable(replayed):
        lines.append(f"- replay of {search.cfg.replay}: {replayed()}")
    cost = report_cost.Cost.load(rd.path)
    if cost.worth_showing:
        lines.append(f"- LLM cost: {cost.headline()} (section LLM cost below)")
    lines += purpose_table(transcript.read(rd.path))
    events = rd.events()
    eps = getattr(getattr(search, "cfg", None), "eps_rel", None)
    if plot_progress(progress_data(events, s0), search.task.name, rd.path / "progress.png", eps):
        lines += ["", "![every evaluation and the best so far per island](progress.png)"]
    lines += cost.markdown()
    lines += ["", "## Islands", ""]
    for island in search.islands:
        best = island.best
        lines.append(f"### Island {island.index}: best "
                     + (f"{best.score:.4g} ms ({s0 / best.score:.3f}x), program `{best.id}`"
                        if best else "none"))
        lines += ["", "| generation | island best ms | speedup |", "|---:|---:|---:|"]
        step = max(1, len(island.trajectory) // 25)
        for g, ms in island.trajectory[::step] + island.trajectory[-1:] * (step > 1):
            lines.append(f"| {g} | {ms:.4g} | {s0 / ms:.3f}x |")
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


def best_summary(best: dict | None, s0: float) -> str:
    """One line on the best program: what beat the reference, or that nothing did."""
    if not best:
        return "no correct candidate yet"
    if best["runtime_ms"] < s0:
        return (f"**best: {best['runtime_ms']:.4g} ms, {best['speedup']:.3f}x the reference** "
                f"(island {best['island']}, generation {best['generation']}, `best.py`)")
    return (f"**nothing beat the reference ({s0:.4g} ms)**; the fastest correct candidate, "
            f"{best['runtime_ms']:.4g} ms ({best['speedup']:.3f}x, slower), is in `best.py`")


def purpose_table(reading) -> list[str]:
    """report.md's lines on the transcript: calls and tokens per purpose (none without a transcript)."""
    totals = transcript.totals(reading)
    if not totals:
        return []
    out = ["", "LLM calls per purpose (transcript.jsonl; `python transcript.py DIR N` prints call N):", "",
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
    mid = ordered[len(ordered) // 2]
    return (f"reference drift (timed beside each candidate vs s_0): median {mid:+.1%}, from {ordered[0]:+.1%} "
            f"to {ordered[-1]:+.1%} over {len(drifts)} {_plural(len(drifts), 'evaluation')}; scores are "
            "s_0 / speedup, so drift moves none")


def _plural(n: int, word: str) -> str:
    return word if n == 1 else word + "s"

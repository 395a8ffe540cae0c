"""The chart of report.html, as hand-written SVG: the search of paper §3 over its generations.

    report_chart.svg(run) -> str          run: report_data.Run

Top panel: the speedup s_0 / runtime of every correct candidate (a dot, coloured by island, linking
to the candidate), the best so far per island (a step line), the reference at 1.0x, and every
intervention of Algorithm 2 (a dotted line with a triangle: backtrack, labelled with the snapshot it
went back to; a star: crossover, labelled with the partner island). Under it, one letter per failed
candidate, for its status. Bottom panel: each island's momentum m_t (§3.2) with the threshold eps_rel:
an intervention can fire only where m_t falls below it.
Standard library only; no scripts, so it prints and reads with JavaScript off.
"""
from __future__ import annotations

import math
from html import escape

COLOURS = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#7F7F7F", "#000000"]
STATUS_LETTER = {"incorrect": "I", "compile_error": "C", "runtime_error": "R", "timeout": "T",
                 "rejected": "X", "invalid": "V"}

WIDTH, LEFT, RIGHT = 980, 62, 24
ROW = 13                           # one row of intervention marks per island above the panels
SPEED_H, MOM_H = 250, 110          # heights of the speedup and momentum panels


def colour(island: int) -> str:
    return COLOURS[island % len(COLOURS)]


def status_letter(status: str) -> str:
    return STATUS_LETTER.get(status, "?")


def svg(run) -> str:
    rows = {i: n for n, i in enumerate(run.island_ids)}
    top = 10 + ROW * max(1, len(rows))
    fail_y, mom_top = top + SPEED_H + 22, top + SPEED_H + 56
    height = mom_top + MOM_H + 44
    gens = [e for e in run.generations if isinstance(e.get("generation"), (int, float))]
    cands = [c for c in run.candidates.values() if isinstance(c.generation, (int, float))]
    g_max = max([e["generation"] for e in gens] + [c.generation for c in cands] + [1]) + 0.5   # room for repairs
    g_min = min([e["generation"] for e in gens] + [1]) - 1
    speeds = [run.speedup(c.runtime_ms) for c in cands if c.ok]
    best = [run.speedup(e.get("island_best_ms")) for e in gens]
    y_max = max([1.25] + [s * 1.08 for s in speeds + best if s])

    def x(g: float) -> float:
        return LEFT + (g - g_min) / (g_max - g_min) * (WIDTH - LEFT - RIGHT)

    def y(s: float) -> float:
        return top + SPEED_H - min(s, y_max) / y_max * SPEED_H

    def ym(m: float) -> float:
        return mom_top + MOM_H - max(0.0, min(1.0, m)) * MOM_H

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" class="chart" '
           f'role="img" aria-label="speedup, failures and momentum per generation, by island">',
           '<style>text{font:11px sans-serif;fill:#333}.ax{stroke:#999;stroke-width:1}'
           '.grid{stroke:#e4e4e4;stroke-width:1}.ref{stroke:#555;stroke-dasharray:5 4}'
           + "".join(f".i{n}{{fill:{colour(i)};fill-opacity:.75}}.f{n}{{fill:{colour(i)};font:bold 13px monospace;"
                     f"text-anchor:middle}}" for i, n in rows.items()) + '</style>']
    out += _axes(run, x, y, ym, g_min, g_max, y_max, top, fail_y, mom_top, height)
    depth = _repair_depth(run)
    for i in run.island_ids:
        col = colour(i)
        mine = [e for e in gens if e["island"] == i]
        steps = []
        for k, e in enumerate(mine):
            s = run.speedup(e.get("island_best_ms"))
            if s:
                nxt = mine[k + 1]["generation"] if k + 1 < len(mine) else e["generation"]
                steps += [(x(e["generation"]), y(s)), (x(nxt), y(s))]
        if steps:
            out.append(f'<polyline fill="none" stroke="{col}" stroke-width="2" opacity="0.8" '
                       f'points="{_pts(steps)}"><title>island {i}: best so far</title></polyline>')
        moms = [(x(e["generation"]), ym(e["momentum"])) for e in mine
                if isinstance(e.get("momentum"), (int, float))]
        if moms:
            out.append(f'<polyline fill="none" stroke="{col}" stroke-width="1.5" points="{_pts(moms)}">'
                       f'<title>island {i}: momentum m_t</title></polyline>')
    for c in sorted(cands, key=lambda c: c.time):
        gx = x(c.generation + 0.15 * depth.get(c.id, 0))
        label = f"{c.id} island {c.island} gen {c.generation}" + (" repair" if c.repair_of else "")
        if c.ok:   # kept short: a long run draws thousands of these
            s = run.speedup(c.runtime_ms) or 0.0
            shape = (f'<circle class="i{rows.get(c.island, 0)}" cx="{gx:.1f}" cy="{y(s):.1f}" r="3.5">'
                     f'<title>{escape(label)}: {s:.3f}x</title></circle>')
        else:
            shape = (f'<text class="f{rows.get(c.island, 0)}" x="{gx:.1f}" y="{fail_y}">'
                     f'{status_letter(c.status)}<title>{escape(label)}: {escape(c.status)}</title></text>')
        out.append(f'<a href="#p-{escape(c.id)}">{shape}</a>')
    for a in run.actions:
        g = a.get("generation")
        if not isinstance(g, (int, float)):
            continue
        i, col, gx = a["island"], colour(a["island"]), x(g)
        back = a.get("action") == "backtrack"
        label = f"s{a.get('restored_index')}" if back else f"\u00d7{a.get('partner')}"
        mark = "\u25bc" if back else "\u2605"
        what = (f"backtrack to {run.snapshot_label(i, a.get('restored_index'))}" if back
                else f"crossover with island {a.get('partner')}")
        out.append(f'<a href="#act-{i}-{g}"><line x1="{gx:.1f}" x2="{gx:.1f}" y1="{top}" '
                   f'y2="{mom_top + MOM_H}" stroke="{col}" stroke-dasharray="2 3"/>'
                   f'<text x="{gx:.1f}" y="{6 + ROW * (rows.get(i, 0) + 1)}" text-anchor="middle" '
                   f'style="fill:{col};font-weight:bold">{mark}'
                   f'{label}<title>island {i}, generation {g}: {escape(what)}</title></text></a>')
    out.append("</svg>")
    return "\n".join(out)


def _repair_depth(run) -> dict[str, int]:
    depth: dict[str, int] = {}
    for c in sorted(run.candidates.values(), key=lambda c: c.time):
        depth[c.id] = depth.get(c.repair_of, -1) + 1 if c.repair_of else 0
    return depth


def _pts(points) -> str:
    return " ".join(f"{a:.1f},{b:.1f}" for a, b in points)


def _ticks(lo: float, hi: float, n: int = 8) -> list[float]:
    step = 10 ** math.floor(math.log10(max((hi - lo) / n, 1e-9)))
    for m in (1, 2, 5, 10):
        if (hi - lo) / (step * m) <= n:
            step *= m
            break
    first = math.ceil(lo / step) * step
    return [first + k * step for k in range(int((hi - first) / step) + 1)]


def _axes(run, x, y, ym, g_min, g_max, y_max, top, fail_y, mom_top, height) -> list[str]:
    right = WIDTH - RIGHT
    out = []
    for t in _ticks(0, y_max, 6):
        out.append(f'<line class="grid" x1="{LEFT}" x2="{right}" y1="{y(t):.1f}" y2="{y(t):.1f}"/>'
                   f'<text x="{LEFT - 6}" y="{y(t) + 4:.1f}" text-anchor="end">{t:g}x</text>')
    for t in _ticks(g_min, math.floor(g_max), 12):
        if t == int(t):
            out.append(f'<line class="grid" x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{top}" y2="{mom_top + MOM_H}"/>'
                       f'<text x="{x(t):.1f}" y="{mom_top + MOM_H + 16}" text-anchor="middle">{t:g}</text>')
    out.append(f'<line class="ref" x1="{LEFT}" x2="{right}" y1="{y(1.0):.1f}" y2="{y(1.0):.1f}"/>'
               f'<text x="{right - 2}" y="{y(1.0) - 4:.1f}" text-anchor="end">reference 1.0x</text>')
    out.append(f'<text x="14" y="{top + SPEED_H / 2}" transform="rotate(-90 14 {top + SPEED_H / 2})" '
               f'text-anchor="middle">speedup over the reference</text>')
    out.append(f'<text x="{LEFT - 6}" y="{fail_y}" text-anchor="end">failed</text>')
    for t in (0.0, 0.5, 1.0):
        out.append(f'<line class="grid" x1="{LEFT}" x2="{right}" y1="{ym(t):.1f}" y2="{ym(t):.1f}"/>'
                   f'<text x="{LEFT - 6}" y="{ym(t) + 4:.1f}" text-anchor="end">{t:g}</text>')
    eps = run.config.get("eps_rel")
    if isinstance(eps, (int, float)):
        out.append(f'<line class="ref" x1="{LEFT}" x2="{right}" y1="{ym(eps):.1f}" y2="{ym(eps):.1f}"/>'
                   f'<text x="{right - 2}" y="{ym(eps) + 13:.1f}" text-anchor="end">eps_rel = {eps:g}</text>')
    out.append(f'<text x="14" y="{mom_top + MOM_H / 2}" transform="rotate(-90 14 {mom_top + MOM_H / 2})" '
               f'text-anchor="middle">momentum m_t</text>')
    out.append(f'<text x="{(LEFT + right) / 2}" y="{height - 6}" text-anchor="middle">generation</text>')
    out.append(f'<rect x="{LEFT}" y="{top}" width="{right - LEFT}" height="{SPEED_H}" fill="none" class="ax"/>'
               f'<rect x="{LEFT}" y="{mom_top}" width="{right - LEFT}" height="{MOM_H}" fill="none" class="ax"/>')
    return out

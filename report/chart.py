"""The chart of report.html, as hand-written SVG: the search of paper §3 over its generations.

    chart.svg(run) -> str          run: report.data.Run

Three panels share the generation axis. Top: the speedup s_0 / runtime of every correct candidate (a dot,
coloured by island, linking to the candidate), the best so far per island (a step line; coinciding lines
are drawn OFFSET px apart so none hides another), the reference at 1.0x, and every intervention of
Algorithm 2 (a dotted line with a triangle: backtrack, labelled with the snapshot it went back to; a star:
crossover, labelled with the partner island). Middle: a band of its own for the failed candidates, one row
per island, one letter per candidate for its status. Bottom: each island's momentum m_t (§3.2) in a lane of
its own, with the threshold eps_rel: an intervention can fire only where m_t falls below it. The lanes are
linear for eps_rel >= LINEAR_FROM and otherwise logarithmic down to a decade below eps_rel (the paper's
eps_rel = 0.001 would sit on the zero line of a linear scale). Every candidate gets one mark (class
"mark"), every intervention one (class "act").
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
SPEED_H = 250                      # height of the speedup panel
FAIL_ROW = 15                      # one row of the failed band per island
LANE = 52                          # one momentum lane per island ...
LANE_GAP = 6                       # ... and the space between lanes
LINEAR_FROM = 0.2                  # eps_rel from which the momentum lanes are linear
GAP = 16                           # between panels
OFFSET = 2.0                       # px between the best-so-far lines of consecutive islands


def colour(island: int) -> str:
    return COLOURS[island % len(COLOURS)]


def status_letter(status: str) -> str:
    return STATUS_LETTER.get(status, "?")


def svg(run) -> str:
    rows = {i: n for n, i in enumerate(run.island_ids)}
    n_rows = max(1, len(rows))
    top = 10 + ROW * n_rows
    fail_top = top + SPEED_H + GAP
    mom_top = fail_top + FAIL_ROW * n_rows + GAP
    bottom = mom_top + (LANE + LANE_GAP) * n_rows - LANE_GAP
    height = bottom + 40
    gens = [e for e in run.generations if isinstance(e.get("generation"), (int, float))]
    cands = [c for c in run.candidates.values() if isinstance(c.generation, (int, float))]
    g_max = max([e["generation"] for e in gens] + [c.generation for c in cands] + [1]) + 0.5   # room for repairs
    g_min = min([e["generation"] for e in gens] + [1]) - 1
    speeds = [run.speedup(c.runtime_ms) for c in cands if c.ok]
    best = [run.speedup(e.get("island_best_ms")) for e in gens]
    y_max = max([1.25] + [s * 1.08 for s in speeds + best if s])
    eps = run.config.get("eps_rel")
    m_floor = momentum_floor(eps)

    def x(g: float) -> float:
        return LEFT + (g - g_min) / (g_max - g_min) * (WIDTH - LEFT - RIGHT)

    def y(s: float) -> float:
        return top + SPEED_H - min(s, y_max) / y_max * SPEED_H

    def ym(m: float, island: int) -> float:
        lane = mom_top + (LANE + LANE_GAP) * rows.get(island, 0)
        return lane + 4 + (LANE - 8) * (1 - momentum_scale(m, m_floor))

    def yf(island: int) -> float:
        return fail_top + FAIL_ROW * rows.get(island, 0) + FAIL_ROW - 3

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" class="chart" '
           f'role="img" aria-label="speedup, failures and momentum per generation, by island">',
           '<style>text{font:11px sans-serif;fill:#333}.ax{stroke:#999;stroke-width:1}'
           '.grid{stroke:#e4e4e4;stroke-width:1}.ref{stroke:#555;stroke-dasharray:5 4}'
           + "".join(f".i{n}{{fill:{colour(i)};fill-opacity:.75}}.f{n}{{fill:{colour(i)};font:bold 12px monospace;"
                     f"text-anchor:middle}}" for i, n in rows.items()) + '</style>']
    out += _axes(run, rows, x, y, ym, g_min, g_max, y_max, m_floor, top, fail_top, mom_top, bottom, height)
    depth = _repair_depth(run)
    for i in run.island_ids:
        col = colour(i)
        mine = [e for e in gens if e["island"] == i]
        dy = OFFSET * (rows[i] - (n_rows - 1) / 2)
        steps = []
        for k, e in enumerate(mine):
            s = run.speedup(e.get("island_best_ms"))
            if s:
                nxt = mine[k + 1]["generation"] if k + 1 < len(mine) else e["generation"]
                steps += [(x(e["generation"]), y(s) + dy), (x(nxt), y(s) + dy)]
        if steps:
            out.append(f'<polyline fill="none" stroke="{col}" stroke-width="2" opacity="0.8" '
                       f'points="{_pts(steps)}"><title>island {i}: best so far</title></polyline>')
        moms = [(x(e["generation"]), ym(e["momentum"], i)) for e in mine
                if isinstance(e.get("momentum"), (int, float))]
        if moms:
            out.append(f'<polyline fill="none" stroke="{col}" stroke-width="1.5" points="{_pts(moms)}">'
                       f'<title>island {i}: momentum m_t</title></polyline>')
    for c in sorted(cands, key=lambda c: c.time):
        gx = x(c.generation + 0.15 * depth.get(c.id, 0))
        label = f"{c.id} island {c.island} gen {c.generation}" + (" repair" if c.repair_of else "")
        if c.ok:   # kept short: a long run draws thousands of these
            s = run.speedup(c.runtime_ms) or 0.0
            shape = (f'<circle class="mark i{rows.get(c.island, 0)}" cx="{gx:.1f}" cy="{y(s):.1f}" r="3.5">'
                     f'<title>{escape(label)}: {s:.3f}x</title></circle>')
        else:
            shape = (f'<text class="mark f{rows.get(c.island, 0)}" x="{gx:.1f}" y="{yf(c.island):.1f}">'
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
                   f'y2="{bottom}" stroke="{col}" stroke-dasharray="2 3"/>'
                   f'<text class="act" x="{gx:.1f}" y="{6 + ROW * (rows.get(i, 0) + 1)}" text-anchor="middle" '
                   f'style="fill:{col};font-weight:bold">{mark}'
                   f'{label}<title>island {i}, generation {g}: {escape(what)}</title></text></a>')
    out.append("</svg>")
    return "\n".join(out)


def momentum_floor(eps) -> float:
    """The bottom of the momentum scale: 0 (linear) when eps_rel >= LINEAR_FROM, else a power of ten a
    decade or more below eps_rel (log), so the threshold line stands clear of the bottom."""
    eps = eps if isinstance(eps, (int, float)) and eps > 0 else 0.001
    return 0.0 if eps >= LINEAR_FROM else 10 ** math.floor(math.log10(eps) - 1)


def momentum_scale(m: float, floor: float) -> float:
    """m from the bottom (0) to 1 (1), linear when floor is 0, else logarithmic; m below the floor sits on it."""
    m = max(floor, min(1.0, m)) if isinstance(m, (int, float)) and not math.isnan(m) else floor
    return m if floor == 0 else math.log10(m / floor) / math.log10(1 / floor)


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


def _axes(run, rows, x, y, ym, g_min, g_max, y_max, m_floor, top, fail_top, mom_top, bottom, height) -> list[str]:
    right = WIDTH - RIGHT
    out = []
    for t in _ticks(0, y_max, 6):
        out.append(f'<line class="grid" x1="{LEFT}" x2="{right}" y1="{y(t):.1f}" y2="{y(t):.1f}"/>'
                   f'<text x="{LEFT - 6}" y="{y(t) + 4:.1f}" text-anchor="end">{t:g}x</text>')
    for t in _ticks(g_min, math.floor(g_max), 12):
        if t == int(t):
            out.append(f'<line class="grid" x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{top}" y2="{bottom}"/>'
                       f'<text x="{x(t):.1f}" y="{bottom + 16}" text-anchor="middle">{t:g}</text>')
    out.append(f'<line class="ref" x1="{LEFT}" x2="{right}" y1="{y(1.0):.1f}" y2="{y(1.0):.1f}"/>'
               f'<text x="{right - 2}" y="{y(1.0) - 4:.1f}" text-anchor="end">reference 1.0x</text>')
    out.append(f'<text x="14" y="{top + SPEED_H / 2}" transform="rotate(-90 14 {top + SPEED_H / 2})" '
               f'text-anchor="middle">speedup over the reference</text>')
    band = FAIL_ROW * len(rows or {0: 0})
    out.append(f'<rect x="{LEFT}" y="{fail_top}" width="{right - LEFT}" height="{band}" fill="#fbf3f2" class="ax"/>'
               f'<text x="{LEFT - 6}" y="{fail_top + band / 2 + 4}" text-anchor="end">failed</text>')
    eps = run.config.get("eps_rel")
    lanes = list(rows) or [0]
    for i in lanes:
        lane = mom_top + (LANE + LANE_GAP) * rows.get(i, 0)
        out.append(f'<rect x="{LEFT}" y="{lane}" width="{right - LEFT}" height="{LANE}" fill="none" class="ax"/>'
                   f'<text x="{LEFT + 4}" y="{lane + LANE - 4}" style="fill:{colour(i)}">island {i}</text>')
        for t in (1.0, m_floor):
            out.append(f'<text x="{LEFT - 6}" y="{ym(t, i) + 4:.1f}" text-anchor="end">{t:g}</text>')
        if isinstance(eps, (int, float)):
            ye = ym(eps, i)
            out.append(f'<line class="ref" x1="{LEFT}" x2="{right}" y1="{ye:.1f}" y2="{ye:.1f}"/>'
                       f'<text x="{right - 4}" y="{ye - 3 if ye - lane > 16 else ye + 12:.1f}" '
                       f'text-anchor="end">eps_rel = {eps:g}</text>')
    mid = (mom_top + bottom) / 2
    out.append(f'<text x="14" y="{mid}" transform="rotate(-90 14 {mid})" text-anchor="middle">'
               f'momentum m_t{"" if m_floor == 0 else " (log)"}</text>')
    out.append(f'<text x="{(LEFT + right) / 2}" y="{height - 6}" text-anchor="middle">generation</text>')
    out.append(f'<rect x="{LEFT}" y="{top}" width="{right - LEFT}" height="{SPEED_H}" fill="none" class="ax"/>')
    return out

"""report.html: one self-contained page that shows a PACEvolve run (paper §3, Algorithms 1 and 2) at work.

    report_html.write(run_dir) -> Path     # run_dir/report.html, from the run directory's files alone

run.py calls it after every round, at the end and on Ctrl-C; `python run.py --report DIR` draws it for
any run directory, finished, running or killed. The page, top to bottom:
  1. the run: task, device, reference time s_0, best speedup, time, LLM calls and tokens per model,
     evaluations per status, LLM failures;
  2. the best kernel: the idea and experiment that produced it and its lineage (every program it was
     written from, back to the reference);
  3. the chart (report/chart.py): every evaluation by island, best so far, momentum m_t, interventions;
  4. every intervention of Algorithm 2: m_t against eps_rel, A_i and A_j, the weights w_BT and w_Cj
     (crossover.py), the sampled action and what it did;
  5. per island: the idea pool now (Algorithm 1's P, each idea with its hypotheses and results), ideas
     no longer in it (pruned, or left behind by a backtrack: the permanent log L), the pool before and
     after each backtrack, and the history of its generations;
  6. every candidate: verdict, evaluator message, timing, parent, idea, LLM cost, source and diff with its
     parent; then what the LLM calls cost (report/cost.py), when a model costs money or there are several;
  7. the LLM exchanges (report/exchanges.py, from transcript.jsonl): calls and tokens per purpose, then every
     call by island and generation, its prompt and reply folded, within a budget of characters.
Links join candidates, ideas, generations, interventions and the exchanges (a candidate to the call whose
reply carried it, a generation to its calls, an idea to the calls that proposed, added, merged, summarised
or pruned it). The fastest INLINE_SOURCES candidates
and the best one's nearest ancestors get their source inline; every candidate gets one row, with its
diff inline while the page stays within DIFF_BUDGET characters of diffs and relative links to
candidates/ beyond it, so a 1,000-generation run stays a few MB. No server, network or script library: <details> elements fold,
and a few lines of plain JavaScript unfold them for printing.
Standard library only.
"""
from __future__ import annotations

import datetime
import difflib
import json
import os
import threading
from html import escape
from pathlib import Path

from report import chart as report_chart
from report import cost as report_cost
from report import data as report_data
from report import exchanges as report_exchanges

INLINE_SOURCES = 10        # candidates, fastest first, whose full source is on the page
DIFF_BUDGET = 600_000      # characters of inline diffs for the other candidates
DIFF_LINES = 400           # longest single inline diff (lines)


def write(run_dir) -> Path:
    run_dir = Path(run_dir)
    text = render(report_data.load(run_dir))
    path = run_dir / "report.html"
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)   # a browser reloading mid-run never sees half a page
    return path


def render(run: report_data.Run) -> str:
    page = _Page(run)
    title = f"pacevolve run: {report_data.task_name(run)}"
    body = [f"<h1>{_e(title)}</h1>"]
    for anchor, heading, part in SECTIONS:
        html = getattr(page, part)()
        if html:
            page.shown.add(anchor)
            body.append(f'<section id="{anchor}"><h2>{heading}</h2>\n{html}\n</section>')
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1"><title>{_e(title)}</title>'
            f"<style>{CSS}</style></head><body>\n{page.contents()}\n" + "\n".join(body) +
            f"\n<script>{PRINT_JS}</script></body></html>\n")


SECTIONS = [("run", "The run", "summary"), ("best", "The best kernel", "best"),
            ("chart", "Every evaluation, by island", "chart"),
            ("interventions", "Interventions (Algorithm 2)", "interventions"), ("islands", "Islands", "islands"),
            ("candidates", "Candidates", "candidates"), ("cost", "LLM cost", "cost"),
            ("exchanges", "LLM exchanges", "exchanges"),
            ("other-events", "Other events", "other_events"),
            ("configuration", "Configuration", "configuration")]

CSS = """
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;margin:0 auto;max-width:1100px;padding:0 18px 60px;color:#222}
h1{font-size:22px;margin:18px 0 6px}h2{font-size:18px;border-bottom:2px solid #ddd;margin-top:34px;padding-bottom:3px}
h3{font-size:15px;margin:22px 0 6px}h4{font-size:14px;margin:14px 0 4px}
table{border-collapse:collapse;margin:6px 0;font-size:13px}td,th{border:1px solid #ddd;padding:3px 7px;vertical-align:top;text-align:left}
th{background:#f4f4f4}td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.kv th{width:200px}code,pre{font:12px/1.4 ui-monospace,'DejaVu Sans Mono',Menlo,monospace}
pre{background:#f7f7f7;border:1px solid #e3e3e3;padding:7px 9px;overflow-x:auto;white-space:pre-wrap;word-break:break-word;margin:4px 0}
pre.msg{background:#fff6f4;border-color:#f1cfc7}td.msg{white-space:pre-wrap;font-size:12px}.ok{color:#0a7a2f;font-weight:600}.bad{color:#b3261e;font-weight:600}
.add{background:#e6ffec}.del{background:#ffebe9}.hunk{color:#6f42c1}
details{margin:3px 0}summary{cursor:pointer}details.x{margin-left:16px}h5{font-size:12px;margin:6px 0 2px;color:#555}.card{border:1px solid #ddd;border-radius:6px;padding:4px 12px 8px;margin:12px 0}
.best{border:2px solid #0a7a2f}.chosen{font-weight:700;background:#fff3c4}.muted{color:#777}.dot{font-size:16px}
nav{font-size:13px;margin:4px 0 12px}nav a{margin-right:12px}.chart{width:100%;height:auto;border:1px solid #eee}
a{color:#0b57d0;text-decoration:none}a:hover{text-decoration:underline}tr:target,.card:target,details:target>summary{background:#fff3c4}
@media print{body{max-width:none}details>summary{list-style:none}a{color:#222}}
"""

# Closed <details> do not print; open them all for printing, and open the one a link points into.
PRINT_JS = """
window.addEventListener('beforeprint',function(){document.querySelectorAll('details').forEach(function(d){d.open=true})});
function openTarget(){var t=document.getElementById(decodeURIComponent(location.hash.slice(1)));
for(;t;t=t.parentElement){if(t.tagName==='DETAILS'){t.open=true}}}
window.addEventListener('hashchange',openTarget);openTarget();
"""


class _Page:
    """The page's sections, sharing the run and the anchors that join them."""

    def __init__(self, run: report_data.Run):
        self.run = run
        self.shown: set[str] = set()   # the sections drawn, for the contents
        self.s0 = run.baseline_ms
        self.gen_events = {(e["island"], e.get("generation")): e for e in run.generations}
        self.idea_anchor: dict[tuple, str] = {}
        self.past: dict[int, list[dict]] = {}
        for i in run.island_ids:
            for idea in (run.island(i).get("pool") or {}).get("ideas", []):
                self.idea_anchor[(i, idea.get("id"), idea.get("description"))] = f"idea-{i}-{idea.get('id')}"
                self.idea_anchor.setdefault((i, idea.get("id"), None), f"idea-{i}-{idea.get('id')}")
            self.past[i] = run.past_ideas(i)
            for n, idea in enumerate(self.past[i]):
                self.idea_anchor.setdefault((i, idea["id"], idea["description"]), f"idea-{i}-past{n}")
        best = run.best()
        ok = [c for c in run.ranked() if c.ok]
        self.cards = [c.id for c in ok[:INLINE_SOURCES]]
        if best:   # the nearest ancestors of the best, so a long lineage stays a few cards
            self.cards += [c.id for c in run.lineage(best.id)[-INLINE_SOURCES:] if c.id not in self.cards]
        self.x = report_exchanges.Exchanges(run, self.cards, self._prog_link)

    # -- sections -----------------------------------------------------------------------------

    def contents(self) -> str:
        return "<nav>" + "".join(f'<a href="#{a}">{t}</a>' for a, t, _ in SECTIONS[:8] if a in self.shown) + "</nav>"

    def summary(self) -> str:
        run, cfg, ck = self.run, self.run.config, self.run.checkpoint
        best = run.best()
        name, asked = report_data.task_name(run), cfg.get("task")
        rows = [("task", _e(name) + (f" <span class=muted>(--task {_e(asked)})</span>" if asked and asked != name else "")),
                ("device", _e(run.meta.get("hardware") or run.meta.get("device") or "unknown")),
                ("reference s_0", (f"{self.s0:.4g} ms (PyTorch, as the recording measured it)" if cfg.get("replay")
                                   else f"{self.s0:.4g} ms (PyTorch, measured at the start on the same device)")
                 if self.s0 else "not measured yet"),
                ("best", self._best_text(best) if best and best.ok else "no correct candidate yet"),
                ("state", self._state()),
                ("time", self._times())]
        if cfg.get("replay"):
            rows.insert(0, ("replay", f"of {_e(cfg['replay'])}: the LLM's replies, s_0 and the figures below are "
                                      "the recording's; every candidate was built and evaluated again on this "
                                      "machine and its verdict compared with the recorded one (report.md's "
                                      "replay line)"))
        usage = ck.get("usage") or {}
        models = {"main": cfg.get("model"), "secondary": cfg.get("secondary_model")}
        for name, u in usage.items():
            if u:
                rows.append((f"LLM {name} ({_e(models.get(name) or '?')})",
                             f"{report_data.calls_text(u)}, {u.get('prompt_tokens', 0):,} prompt + "
                             f"{u.get('completion_tokens', 0):,} output tokens"
                             + (f" ({u['reasoning_tokens']:,} reasoning)" if u.get("reasoning_tokens") else "")
                             + (f", {u['retries']} retries" if u.get("retries") else "")))
        rows.append(("evaluations", self._evaluations()))
        rows.append(("LLM failures", self._llm_failures()))
        rows.append(("settings", _e(", ".join(f"{k}={cfg.get(k)}" for k in (
            "islands", "generations", "beta", "eps_rel", "freeze", "alpha", "k_idea", "k_hyp",
            "proposals", "repairs", "target_speedup", "seed") if cfg.get(k) is not None))))
        return _kv(rows)

    def best(self) -> str:
        run, best = self.run, self.run.best()
        out = []
        if not best or not best.ok:
            return "<p>No correct candidate yet.</p>"
        out.append(f"<p>{self._best_text(best)}.</p><p>Its idea: "
                   f"{self._idea_link(best.island, best.idea, best.idea_text)}<br>Its experiment: "
                   f"<q>{_e(best.experiment)}</q></p>")
        chain = run.lineage(best.id)
        out.append("<h4>How it came about (each program was written from the one above it)</h4>"
                   "<table><tr><th>program</th><th>island / generation</th><th>idea</th><th>experiment</th>"
                   "<th>result</th></tr>")
        first = chain[0] if chain else best
        if first.parent is None and first.parent_recorded:
            out.append('<tr><td colspan="5">the PyTorch reference (1.0x)</td></tr>')
        for c in chain:
            out.append(f"<tr><td>{self._prog_link(c.id)}" + (" (repair)" if c.repair_of else "") +
                       f"</td><td>{c.island} / {self._gen_link(c.island, c.generation)}</td>"
                       f"<td>{self._idea_link(c.island, c.idea, c.idea_text)}</td><td>{_e(c.experiment)}</td>"
                       f"<td>{self._verdict(c)}</td></tr>")
        out.append("</table>")
        before = [e for e in run.generations if e["island"] == best.island
                  and isinstance(e.get("generation"), int) and e["generation"] < (best.generation or 0)]
        if before:
            out.append(f"<p>Before it, island {best.island} ran {_plural(len(before), 'generation')}: "
                       f'see <a href="#history-{best.island}">its history</a>. Experiments on the same idea '
                       f"before it:</p><ul>")
            same = [e for e in before if e.get("idea") == best.idea
                    and e.get("idea_text", "") == best.idea_text]
            if len(same) > INLINE_SOURCES:
                out.append(f"<li>{len(same) - INLINE_SOURCES} earlier ones: see the history</li>")
            out += [f"<li>generation {self._gen_link(e['island'], e['generation'])}: {_e(e.get('experiment'))}"
                    f" → {self._event_result(e)}</li>" for e in same[-INLINE_SOURCES:]] or ["<li>none</li>"]
            out.append("</ul>")
        return "\n".join(out)

    def chart(self) -> str:
        legend = " ".join(f'<span class=dot style="color:{report_chart.colour(i)}">●</span> island {i}'
                          for i in self.run.island_ids)
        letters = ", ".join(f"{v} {k}" for k, v in report_chart.STATUS_LETTER.items())
        return (f"<p>{legend}. Top: one dot per correct candidate (speedup = s_0 / score; a repair sits just "
                f"right of its generation) and each island's best so far. Middle, in a band of its own: one "
                f"letter per failed candidate, a row per island ({letters}, ? other). Bottom: each island's "
                f"momentum m_t in its own lane (on a log scale when eps_rel is small); below eps_rel, once the freeze period is over, "
                f"the island intervenes: ▼sK backtrack to snapshot K, ★×j crossover with island j. Every mark "
                f"links to its candidate or intervention.</p>" + report_chart.svg(self.run))

    def interventions(self) -> str:
        run = self.run
        out = ["<p>An island intervenes when its momentum m_t falls below eps_rel after its freeze period. "
               "A_i is how far island i has closed the gap to the target (1 = reached). The weights are "
               "crossover.py's: A_best = max over the other islands j≠i of A_j, S = max(0, 1 − |A_i − A_best|); "
               "w_BT = max(0, A_i − A_best) + S(1 − A_i)(1 − A_best); w_Cj = max(0, A_j − A_i), plus "
               "S·A_i·A_best for the best partner. The action is drawn with probability P = w / Σw; the "
               "one drawn is highlighted.</p>"]
        if not run.actions:
            return "\n".join(out) + "<p>No intervention yet.</p>"
        eps = run.config.get("eps_rel")
        out.append("<table><tr><th>island</th><th>generation</th><th>m_t &lt; eps_rel</th><th>A_i</th>"
                   "<th>weights w (probability P)</th><th>what happened</th></tr>")
        for a in run.actions:
            i, g = a["island"], a.get("generation")
            e = self.gen_events.get((i, g), {})
            m = e.get("momentum")
            weights = a.get("weights") or {}
            total = sum(v for v in weights.values() if isinstance(v, (int, float))) or 1.0
            chosen = "backtrack" if a.get("action") == "backtrack" else str(a.get("partner"))
            cells = []
            for k, w in weights.items():
                name = "w_BT" if k == "backtrack" else f"w_C{k}"
                a_j = "" if k == "backtrack" else f", A_{k} = {_num((a.get('A_others') or {}).get(k))}"
                cls = ' class="chosen"' if k == chosen else ""
                cells.append(f"<div{cls} style='white-space:nowrap'>{name} = {_num(w)} (P {_num(w / total if isinstance(w, (int, float)) else None)}"
                             f"{a_j})</div>")
            out.append(f'<tr id="act-{i}-{g}"><td>{i}</td><td>{self._gen_link(i, g)}</td>'
                       f"<td class=n>{_num(m)} {'&lt;' if _below(m, eps) else 'vs'} {_num(eps)}</td><td class=n>{_num(a.get('A_self'))}</td>"
                       f"<td>{''.join(cells)}</td><td>{self._action_text(a)}</td></tr>")
        return "\n".join(out) + "</table>"

    def islands(self) -> str:
        out = []
        k_idea = self.run.config.get("k_idea")
        for i in self.run.island_ids:
            d = self.run.island(i)
            best = (d.get("best") or {}).get("id")
            mine = [e for e in self.run.generations if e["island"] == i]
            acts = [a for a in self.run.actions if a["island"] == i]
            out.append(f'<h3 id="island-{i}"><span style="color:{report_chart.colour(i)}">●</span> Island {i}</h3>'
                       f"<p>{len(mine)} generations, {len(acts)} interventions; best: "
                       + (self._prog_link(best) + " " + self._verdict(self.run.candidates[best])
                          if best in self.run.candidates else "none") + "</p>")
            pool = (d.get("pool") or {}).get("ideas", [])
            out.append(f"<h4>Idea pool now ({len(pool)} ideas; K_idea = {k_idea})</h4>")
            out += [self._idea(i, idea, f"idea-{i}-{idea.get('id')}", open_=True) for idea in pool]
            if not pool:
                out.append("<p class=muted>empty (or no checkpoint yet)</p>")
            if self.past[i]:
                out.append("<h4>Ideas no longer in the pool (from the permanent log)</h4>")
                out += [self._idea(i, idea, f"idea-{i}-past{n}", open_=False,
                                   why="pruned (|P| > K_idea)" if idea["pruned"] else "left behind by a backtrack")
                        for n, idea in enumerate(self.past[i])]
            backs = [a for a in acts if a.get("action") == "backtrack"]
            if backs:
                out.append("<h4>The pool at each backtrack</h4>")
                out += [self._backtrack_pools(a) for a in backs]
            out.append(self._history(i, mine, acts))
        return "\n".join(out)

    def candidates(self) -> str:
        run = self.run
        out = [f"<p>{len(run.candidates)} programs evaluated. The {len(self.cards)} below with their source are "
               "the fastest and the best one's ancestors; every candidate has a row in the table after them, "
               "with the evaluator's verdict and its diff against the program it was written from. Sources "
               "are also in the run directory's <code>candidates/</code>.</p>"]
        out += [self._card(run.candidates[pid], n == 0) for n, pid in enumerate(self.cards)]
        out.append('<h3 id="all-candidates">Every candidate, fastest first, then the failures in order</h3>'
                   "<table><tr><th>program</th><th>island / gen</th><th>verdict</th>"
                   "<th>evaluator message</th><th>parent</th><th>written by</th><th>diff</th></tr>")
        budget = DIFF_BUDGET
        for c in run.ranked():
            anchor = "" if c.id in self.cards else f' id="p-{_e(c.id)}"'
            diff = self._diff(c) if budget > 0 else None
            budget -= len(diff or "")
            diff_cell = (f"<details><summary>{diff.count(chr(10))} lines</summary><pre>{diff}</pre></details>"
                         if diff else self._file_links(c))
            name = self._prog_link(c.id) if c.id in self.cards else f"<code>{_e(c.id)}</code>"
            out.append(f"<tr{anchor}><td>{name}</td><td>{self._where(c)}</td>"
                       f"<td>{self._verdict(c)}</td>"
                       f"<td class=msg>{'' if c.ok else _e(c.message[:600])}</td><td>{self._parent_text(c)}</td>"
                       f"<td>{self.x.call_link(self.run.program_calls.get(c.id), short=True)}{self._cost(c)}</td>"
                       f"<td>{diff_cell}</td></tr>")
        return "\n".join(out) + "</table>"

    def cost(self) -> str:
        return report_cost.Cost.load(self.run.path).html()

    def exchanges(self) -> str:
        return self.x.section()

    def other_events(self) -> str:
        others = self.run.other_events
        if not others:
            return ""
        kinds: dict[str, int] = {}
        for e in others:
            kinds[str(e.get("type"))] = kinds.get(str(e.get("type")), 0) + 1
        rows = "".join(f"<tr><td>{_clock(e.get('time'))}</td><td>{_e(e.get('type'))}</td><td><code>"
                       f"{_e(json.dumps({k: v for k, v in e.items() if k not in ('type', 'time')})[:600])}"
                       f"</code></td></tr>" for e in others[-500:])
        return ("<p>" +
                ", ".join(f"{_e(k)}: {v}" for k, v in kinds.items()) +
                f"</p><details><summary>the last {min(500, len(others))}</summary><table>"
                f"<tr><th>time</th><th>kind</th><th>data</th></tr>{rows}</table></details>")

    def configuration(self) -> str:
        return ("<details><summary>config.json</summary><pre>"
                + _e(json.dumps(self.run.meta, indent=1)) + "</pre></details>")

    # -- pieces -------------------------------------------------------------------------------

    def _idea(self, island: int, idea: dict, anchor: str, open_: bool, why: str = "") -> str:
        records = idea.get("hypotheses", idea.get("records", [])) or []
        best = idea.get("best_metric") or ""
        head = (f"Idea {idea.get('id')}: {_e(idea.get('description'))} <span class=muted>— "
                f"{_plural(idea.get('tried', len(records)), 'experiment')}" + (f"; best {_e(best)}" if best else "")
                + (f"; {why}" if why else "") + "</span>")
        rows = [f"<p><b>Summary of earlier experiments:</b> {_e(idea.get('summary'))}</p>"] if idea.get("summary") else []
        rows.append(self.x.idea_links(island, idea.get("id")))
        if records:
            rows.append("<table><tr><th>#</th><th>experiment</th><th>result</th><th>program</th></tr>")
            for n, h in enumerate(records, 1):
                pid = h.get("program_id")
                c = self.run.candidates.get(pid)
                where = f" (gen {self._gen_link(c.island, c.generation)})" if c and c.generation is not None else ""
                rows.append(f"<tr><td class=n>{n}</td><td>{_e(h.get('experiment'))}</td><td>"
                            f"{_status(h.get('status'))} {_e(h.get('result'))}</td><td>"
                            + (self._prog_link(pid) + where if pid else "") + "</td></tr>")
            rows.append("</table>")
        return (f'<details id="{anchor}"{" open" if open_ else ""}><summary>{head}</summary>'
                + "".join(rows) + "</details>")

    def _backtrack_pools(self, a: dict) -> str:
        i, g, k = a["island"], a.get("generation"), a.get("restored_index")
        labels = self.run.snapshot_labels.get(i, [])
        mark = f"the state after generation {g}"
        before = labels.index(mark) if mark in labels else None
        parts = []
        for title, idx in ((f"before: {mark}", before), (f"restored: {self.run.snapshot_label(i, k)} (snapshot {k})", k)):
            pool = self.run.snapshot_pool(i, idx) if idx is not None else None
            ideas = (pool or {}).get("ideas", [])
            items = "".join(f"<li>idea {x.get('id')}: {_e(x.get('description'))} <span class=muted>("
                            f"{_plural(x.get('tried', 0), 'experiment')}" + (f", best {_e(x.get('best_metric'))}"
                                                                 if x.get("best_metric") else "") + ")</span></li>"
                            for x in ideas)
            parts.append(f"<td><b>{_e(title)}</b><ul>{items or '<li>empty</li>'}</ul></td>" if pool is not None
                         else f"<td><b>{_e(title)}</b><p class=muted>not in the checkpoint</p></td>")
        return (f'<details id="bt-{i}-{g}"><summary>generation {g}: back to '
                f"{_e(self.run.snapshot_label(i, k))}</summary><table><tr>{''.join(parts)}</tr></table></details>")

    def _history(self, i: int, mine: list[dict], acts: list[dict]) -> str:
        by_gen = {a.get("generation"): a for a in acts}
        out = [f'<h4 id="history-{i}">History: every generation of island {i}</h4><table>'
               "<tr><th>gen</th><th>idea</th><th>experiment</th><th>result</th><th>programs</th>"
               "<th>m_t</th><th>R_t</th><th>LLM calls</th><th>notes</th></tr>"]
        for e in mine:
            g = e.get("generation")
            progs = ", ".join(self._prog_link(p) for p in (report_data.attempt_ids(e)
                                                            or ([e["program"]] if e.get("program") else [])))
            notes = e.get("notes") or []
            out.append(f'<tr id="g-{i}-{g}"><td class=n>{g}</td>'
                       f"<td>{self._idea_link(i, e.get('idea'), e.get('idea_text', ''), 60)}</td>"
                       f"<td>{_e(_short(e.get('experiment') or '', 240))}</td><td>{self._event_result(e, 0)}</td>"
                       f"<td>{progs}</td>"
                       f"<td class=n>{_num(e.get('momentum'))}</td><td class=n>{_num(e.get('r_t'))}</td>"
                       f"<td class=n>{self.x.calls_link(i, g, e.get('llm_calls', ''))}</td><td>"
                       + (f"<details><summary>{len(notes)}</summary>" + "<br>".join(_e(n) for n in notes)
                          + "</details>" if notes else "") + "</td></tr>")
            if g in by_gen:
                out.append(f'<tr><td></td><td colspan="8">→ <a href="#act-{i}-{g}">intervention</a>: '
                           f"{self._action_text(by_gen[g])}</td></tr>")
        return "\n".join(out) + "</table>"

    def _card(self, c: report_data.Candidate, first: bool) -> str:
        d = c.details or {}
        t = d.get("timing") or {}
        rows = [("verdict", self._verdict(c) + (" <span class=muted>(the speedup, and the score in ms that the "
                                                 "search ranks by)</span>" if c.ok else "")),
                ("evaluator", f"<pre{'' if c.ok else ' class=msg'}>{_e(c.message)}</pre>"),
                ("island / generation", self._where(c)),
                ("idea", self._idea_link(c.island, c.idea, c.idea_text)), ("experiment", _e(c.experiment)),
                ("written from", self._parent_text(c)),
                ("written by", self.x.call_link(self.run.program_calls.get(c.id))
                 + " (the prompt and the reply that carried this program)")]
        if c.children:
            rows.append(("programs written from it", ", ".join(self._prog_link(p) for p in c.children)))
        if self._cost(c):
            rows.append(("LLM cost", self._cost(c) + " <span class=muted>(its generation's calls)</span>"))
        if c.ok and c.paired_speedup and self.s0:
            rows.append(("score", f"{c.runtime_ms:.4g} ms = s_0 {self.s0:.4g} ms (the reference at the start) / "
                                  f"{c.paired_speedup:.3f}, the speedup measured against the reference timed "
                                  f"beside it: {_num4(c.measured_ms)} ms for this program, {_num4(c.beside_ms)} ms "
                                  f"for the reference. A machine that got busier or quieter since the start moves "
                                  f"both, so the score does not move."))
        if t.get("pairs"):
            low, high = t.get("interval") or (None, None)
            rows.append(("timing", f"{_num(t.get('runtime_ms'))} ms per call, the reference {_num(t.get('baseline_ms'))} "
                                   f"ms beside it: {_num(t.get('speedup'))}x (95% interval {_num(low)}-{_num(high)}) "
                                   f"from {t['pairs']} pairs of batches of {t.get('calls_per_batch')} calls, "
                                   f"by {_e(t.get('clock') or 'the parent')}"))
        trials = d.get("trials") or []
        if trials:
            worst = max((x.get("rel_l2") or 0) for x in trials)
            rows.append(("correctness", f"{sum(bool(x.get('ok')) for x in trials)} of {len(trials)} input sets "
                                        f"within tolerance; worst relative L2 error {worst:.2g}"))
        cost = ", ".join(f"{name} {d[k]:.3g} s" for k, name in (("build_wall_s", "build"), ("time_s", "checking and timing"))
                         if isinstance(d.get(k), (int, float)))
        if cost:
            rows.append(("cost", cost))
        src = self._source(c.id)
        diff = self._diff(c)
        return (f'<div class="card{" best" if first else ""}" id="p-{_e(c.id)}"><h3>program {_e(c.id)}'
                + (" — the best" if first else "") + "</h3>" + _kv(rows)
                + (f"<details{' open' if first else ''}><summary>source</summary><pre>{_e(src)}</pre></details>" if src else "")
                + (f"<details><summary>diff against the program it was written from</summary><pre>{diff}</pre></details>"
                   if diff else "") + "</div>")

    def _cost(self, c: report_data.Candidate) -> str:
        spent = report_cost.generation_cost(self.gen_events.get((c.island, c.generation)))
        return f'<span class="cost">{_e(spent)}</span>' if spent else ""

    def _diff(self, c: report_data.Candidate) -> str | None:
        origin = c.repair_of or c.parent
        if not origin:
            return None
        old, new = self._source(origin), self._source(c.id)
        if old is None or new is None:
            return None
        lines = list(difflib.unified_diff(old.splitlines(), new.splitlines(), f"{origin}.py", f"{c.id}.py",
                                          n=2, lineterm=""))
        if len(lines) > DIFF_LINES:
            lines = lines[:DIFF_LINES] + [f"... {len(lines) - DIFF_LINES} more lines"]
        return "\n".join(_diff_line(x) for x in lines) or "(no change)"

    def _source(self, pid: str) -> str | None:
        try:
            return (self.run.path / "candidates" / f"{pid}.py").read_text(errors="replace")
        except OSError:
            return None

    def _file_links(self, c: report_data.Candidate) -> str:
        origin = c.repair_of or c.parent
        return (f'<a href="candidates/{_e(c.id)}.py">source</a>'
                + (f', <a href="candidates/{_e(origin)}.py">parent</a>' if origin else ""))

    def _action_text(self, a: dict) -> str:
        i = a["island"]
        if a.get("action") == "backtrack":
            k = a.get("restored_index")
            return (f'backtrack to snapshot {k}: <a href="#bt-{i}-{a.get("generation")}">'
                    f"{_e(self.run.snapshot_label(i, k))}</a> ({a.get('ideas', '?')} ideas); momentum reset to 1")
        if a.get("action") == "crossover":
            merged = ", ".join(f'<a href="#idea-{i}-{m}">{m}</a>' if f"idea-{i}-{m}" in self.idea_anchor.values()
                               else str(m) for m in a.get("merged_ideas") or [])
            merged = f"its ideas joined the pool as {merged}" if merged else "all its ideas were in the pool already"
            pruned = "; ".join(_e(p) for p in a.get("pruned") or [])
            return (f"crossover with island {a.get('partner')}: its best program {self._prog_link(a.get('parent'))} "
                    f"is the next parent; {merged}"
                    + (f"; {pruned}" if pruned else "") + "; momentum reset to 1")
        return _e(json.dumps({k: v for k, v in a.items() if k not in ("type", "time")})[:300])

    def _best_text(self, c: report_data.Candidate) -> str:
        gb = self.run.checkpoint.get("global_best") or {}   # its confirmed score, after any re-measurement
        ms = gb["runtime_ms"] if gb.get("program") == c.id and gb.get("runtime_ms") else c.runtime_ms
        slower = (self.run.speedup(ms) or 0) < 1
        return (f"<b>{self.run.speedup(ms) or 0:.3f}x</b> the reference (score {ms:.4g} ms "
                f"= s_0 / speedup)" + (", <b>slower</b>: no candidate has beaten the reference" if slower else "")
                + ": "
                f"program {self._prog_link(c.id)}, island {c.island}, generation {self._gen_link(c.island, c.generation)}"
                " (<code>best.py</code>)")

    def _state(self) -> str:
        run = self.run
        done, total = run.checkpoint.get("round"), run.config.get("generations")
        rounds = f"{done} of {total} rounds checkpointed" if done is not None else "no checkpoint yet"
        if run.stopped:
            return f"stopped: {_e(run.stopped)} ({rounds})"
        return (f"{rounds}; no report.md yet: the run is still going, or was killed "
                f"(continue it with <code>python run.py --resume {_e(run.path)}</code>)")

    def _times(self) -> str:
        times = [e["time"] for e in self.run.events if isinstance(e.get("time"), (int, float))]
        if not times:
            return f"started {_e(self.run.meta.get('started', '?'))}"
        return (f"started {_e(self.run.meta.get('started', '?'))}; {(times[-1] - times[0]) / 60:.1f} min from the first "
                f"to the last event ({_clock(times[-1])}); {self.run.checkpoint.get('eval_seconds', 0):.1f} s "
                f"checking and timing candidates")

    def _evaluations(self) -> str:
        counts: dict[str, int] = {}
        for c in self.run.candidates.values():
            counts[c.status] = counts.get(c.status, 0) + 1
        uses = sum(c.uses for c in self.run.candidates.values())
        return (f"{len(self.run.candidates)} programs ({uses} evaluations, re-used results included): "
                + ", ".join(f"{_status(k)} {v}" for k, v in sorted(counts.items())))

    def _llm_failures(self) -> str:
        lost = sum(e.get("status") == "llm_error" for e in self.run.generations)
        calls = sum("LLM call failed" in str(n) for e in self.run.generations for n in e.get("notes") or [])
        client = sum(int(u.get("failures") or 0) for u in (self.run.checkpoint.get("usage") or {}).values() if u)
        kinds = sum("llm" in str(e.get("type")).lower() for e in self.run.other_events)
        return (f"{calls} failed LLM calls recorded in generations, {lost} generations lost to them, "
                f"{client} failures counted by the client" + (f", {kinds} LLM events" if kinds else ""))

    def _verdict(self, c: report_data.Candidate) -> str:
        if c.ok:
            s = self.run.speedup(c.runtime_ms)
            return f"<span class=ok>{s:.3f}x</span> ({c.runtime_ms:.4g} ms)" if s else f"ok ({c.runtime_ms:.4g} ms)"
        return _status(c.status)

    def _event_result(self, e: dict, width: int = 300) -> str:
        s = self.run.speedup(e.get("runtime_ms"))
        if e.get("outcome") == "ok" and s:
            return f"<span class=ok>{s:.3f}x</span> ({e['runtime_ms']:.4g} ms)"
        what = e.get("outcome") or e.get("status")
        return f"{_status(what)} {_e(_short(e.get('message') or '', width))}" if width else _status(what)

    def _parent_text(self, c: report_data.Candidate) -> str:
        if c.repair_of:
            return f"repair of {self._prog_link(c.repair_of)}"
        if c.parent:
            return self._prog_link(c.parent)
        return "the PyTorch reference" if c.parent_recorded else "<span class=muted>not recorded</span>"

    def _prog_link(self, pid) -> str:
        if not pid:
            return ""
        return f'<a href="#p-{_e(pid)}"><code>{_e(pid)}</code></a>' if pid in self.run.candidates \
            else f"<code>{_e(pid)}</code>"

    def _where(self, c: report_data.Candidate) -> str:
        if c.island is None:
            return "<span class=muted>not recorded (its round did not finish)</span>"
        return f"{c.island} / {self._gen_link(c.island, c.generation)}"

    def _gen_link(self, island, g) -> str:
        return f'<a href="#g-{island}-{g}">{g}</a>' if (island, g) in self.gen_events else _e(g)

    def _idea_link(self, island, idea_id, text: str = "", width: int = 90) -> str:
        if idea_id is None:
            return "<span class=muted>none</span>"
        anchor = self.idea_anchor.get((island, idea_id, text or None)) or (
            None if text else self.idea_anchor.get((island, idea_id, None)))
        label = f"idea {idea_id}" + (f": {_short(text, width)}" if text and width else "")
        title = f' title="{_e(text)}"' if text and not width else ""
        return f'<a href="#{anchor}"{title}>{_e(label)}</a>' if anchor else _e(label)


def _below(m, eps) -> bool:
    return isinstance(m, (int, float)) and isinstance(eps, (int, float)) and m < eps


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _kv(rows) -> str:
    return "<table class=kv>" + "".join(f"<tr><th>{_e(k)}</th><td>{v}</td></tr>" for k, v in rows) + "</table>"


def _e(x) -> str:
    return escape("" if x is None else str(x))


def _short(text: str, n: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[:n - 1] + "…"


def _num(x) -> str:
    return f"{x:.3f}" if isinstance(x, (int, float)) else "–"


def _num4(x) -> str:
    return f"{x:.4g}" if isinstance(x, (int, float)) else "–"


def _status(status) -> str:
    return f"<span class=ok>{_e(status)}</span>" if status == "ok" else f"<span class=bad>{_e(status)}</span>"


def _clock(t) -> str:
    if not isinstance(t, (int, float)):
        return ""
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _diff_line(line: str) -> str:
    cls = ("hunk" if line.startswith("@@") else "add" if line.startswith("+") and not line.startswith("+++")
           else "del" if line.startswith("-") and not line.startswith("---") else "")
    return f'<span class="{cls}">{_e(line)}</span>' if cls else _e(line)

"""report.html's LLM exchanges: the transcript (driver/transcript.py) as a section of the page, and the links
into it.

    x = Exchanges(run, cards, prog_link)    # run: report.data.Run; cards: candidate ids shown with their source
    x.section()                             # calls and tokens per purpose, then every call on the page, folded
    x.call_link(call), x.calls_link(island, generation, text), x.idea_links(island, idea_id)

The page shows the prompt and reply of the calls behind the candidates with cards first, then the calls in
the order they were made, within BUDGET characters; a 1,000-generation run makes thousands of calls, and
`python -m driver.transcript RUN_DIR N` prints any of them. Each call is a folded <details id="x-N"> inside its
generation's <details id="xg-ISLAND-GEN"> (a crossover's prune: "xc-..."; the probes: "xg-setup"); a link
to a call that is not on the page says so instead of leading nowhere.
Standard library only (and the project's driver/transcript.py).
"""
from __future__ import annotations

from html import escape

from driver import transcript

BUDGET = 600_000           # characters of LLM prompts and replies on the page
IDEA_LINKS = 4             # calls linked from an idea: the first and the latest this many
PURPOSES = {"idea_generation": "idea generation (Algorithm 1 line 2)",
            "classification": "classification (lines 3-10)", "selection": "selection (line 11)",
            "duplicate_check": "duplicate check (line 12)", "implementation": "code (line 13)",
            "repair": "repair (line 13)", "summary": "summary (lines 17-20)", "prune": "prune (lines 21-24)",
            "probe": "probe (set-up)"}


class Exchanges:
    def __init__(self, run, cards: list[str], prog_link):
        self.run, self.reading, self.prog_link = run, run.transcript, prog_link
        self.inline = self._inline(cards)
        self.groups = {group_anchor(c) for c in self.reading.calls if c.get("call") in self.inline}

    def section(self) -> str:
        reading = self.reading
        if not reading.calls:
            return ("<p>No <code>transcript.jsonl</code> in this run directory: the run was made before LLM "
                    "exchanges were kept.</p>")
        out = ["<p>Every LLM call of the run, as sent and as answered (<code>transcript.jsonl</code>; no keys or "
               "headers are kept). The purpose is the step of Algorithm 1 that asked: idea generation (line 2), "
               "classification (lines 3-10), selection (line 11), duplicate check (line 12), code and repair "
               "(line 13), summary (lines 17-20), prune (lines 21-24, also after a crossover); a format "
               "reminder repeats a call whose reply could not be used. Each call folds open to its prompt "
               "and reply.</p>",
               "<table><tr><th>purpose</th><th>calls</th><th>failed</th><th>format reminders</th>"
               "<th>prompt tokens</th><th>output tokens</th><th>seconds waiting</th><th>retries</th></tr>"]
        for purpose, t in sorted(transcript.totals(reading).items(), key=lambda kv: -kv[1]["calls"]):
            out.append(f"<tr><td>{_e(PURPOSES.get(purpose, purpose))}</td><td class=n>{t['calls']:,}</td>"
                       f"<td class=n>{t['failed']:,}</td><td class=n>{t['reminders']:,}</td>"
                       f"<td class=n>{t['input']:,}</td><td class=n>{t['output']:,}</td>"
                       f"<td class=n>{t['latency_s']:,.1f}</td><td class=n>{t['retries']:,}</td></tr>")
        out.append("</table>")
        groups: dict[str, list[dict]] = {}
        for c in reading.calls:
            groups.setdefault(group_anchor(c), []).append(c)
        hidden, island = 0, object()
        order = sorted(groups.values(), key=lambda cs: (cs[0].get("island") is not None, cs[0].get("island") or 0))
        for calls in order:
            shown = [c for c in calls if c.get("call") in self.inline]
            hidden += len(calls) - len(shown)
            if not shown:
                continue
            if calls[0].get("island") != island:
                island = calls[0].get("island")
                out.append(f"<h3>Island {island}</h3>" if island is not None else "<h3>Set-up</h3>")
            kinds: dict[str, int] = {}
            for c in calls:
                kinds[str(c.get("purpose"))] = kinds.get(str(c.get("purpose")), 0) + 1
            what = ", ".join(_short_purpose(k) + (f" ×{v}" if v > 1 else "") for k, v in kinds.items())
            first = calls[0]
            title = {"setup": "the probe calls, before the run started",
                     "crossover": f"after generation {first.get('generation')}: the prune after a crossover"
                     }.get(first.get("stage"), f"generation {first.get('generation')}")
            out.append(f'<details id="{group_anchor(first)}"><summary>{_e(title)}: '
                       f"{_plural(len(calls), 'call')} ({_e(what)})</summary>"
                       + "".join(self._call(c) for c in shown) + "</details>")
        if hidden:
            out.append(f"<p>{_plural(hidden, 'more call')} not on this page, to keep it within {BUDGET:,} "
                       f"characters of exchanges: <code>python -m driver.transcript {_e(self.run.path)} N</code> "
                       "prints call N.</p>")
        return "\n".join(out)

    def call_link(self, c: dict | None, short: bool = False) -> str:
        """A link to call `c` ("code call 14"; "call 14" when short), or its name when it is not on the page."""
        if not c:
            return "" if short else "<span class=muted>not in the transcript</span>"
        label = ("" if short else _short_purpose(c.get("purpose")) + " ") + f"call {c.get('call')}"
        if c.get("call") in self.inline:
            return f'<a href="#x-{c.get("call")}">{_e(label)}</a>'
        return _e(label) + ("" if short
                            else " <span class=muted>(not on this page: python -m driver.transcript)</span>")

    def calls_link(self, island, generation, text) -> str:
        """`text` linking to the calls island `island` made for `generation`, when they are on the page."""
        anchor = f"xg-{island}-{generation}"
        return f'<a href="#{anchor}">{_e(text)}</a>' if anchor in self.groups else _e(text)

    def idea_links(self, island, idea_id) -> str:
        """The calls that proposed, added, merged, summarised or pruned an idea ("" for none). A long run
        merges proposals into an idea again and again: the first and the latest IDEA_LINKS are named."""
        links = self.run.idea_calls.get((island, idea_id)) if isinstance(idea_id, int) else None
        if not links:
            return ""
        shown = [f"{_e(what)} by {self.call_link(c)}" for what, c in links[:IDEA_LINKS]]
        if len(links) > 2 * IDEA_LINKS:
            shown.append(f"{len(links) - 2 * IDEA_LINKS} more")
        shown += [f"{_e(what)} by {self.call_link(c)}" for what, c in links[max(IDEA_LINKS, len(links) - IDEA_LINKS):]]
        return "<p class=muted>LLM calls: " + ", ".join(shown) + "</p>"

    # -- pieces -------------------------------------------------------------------------------

    def _call(self, c: dict) -> str:
        reading, n = self.reading, c.get("call")
        tokens = c.get("tokens") or {}
        bits = [f"call {n}", _e(_short_purpose(c.get("purpose"))) + (" (format reminder)" if c.get("attempt") else ""),
                f"{_e(c.get('role'))} model {_e(c.get('model') or '?')}"]
        if tokens:
            bits.append(f"{tokens.get('input', 0):,} + {tokens.get('output', 0):,} tokens")
        bits.append(f"{c.get('latency_s') or 0:.1f} s")
        if c.get("retries"):
            bits.append(f"{c['retries']} retr{'y' if c['retries'] == 1 else 'ies'}")
        if c.get("error") is not None:
            bits.append(f"<span class=bad>failed: {_e(str(c['error']).split(':')[0])}</span>")
        if c.get("program"):
            bits.append(f"wrote {self.prog_link(c['program'])}")
        reply = (f"<h5>reply</h5><pre>{_e(reading.text(c.get('reply')))}</pre>" if c.get("reply") is not None
                 else f"<h5>error</h5><pre class=msg>{_e(c.get('error'))}</pre>")
        return (f'<details id="x-{n}" class=x><summary>{" · ".join(bits)}</summary>'
                f"<h5>prompt</h5><pre>{_e(reading.prompt(c))}</pre>{reply}</details>")

    def _inline(self, cards: list[str]) -> set:
        """The calls whose prompt and reply the page shows: those behind the cards, then in order, within
        BUDGET characters."""
        reading, budget, chosen = self.reading, BUDGET, set()
        behind = [self.run.program_calls[pid] for pid in cards if pid in self.run.program_calls]
        for k, c in enumerate(behind + reading.calls):
            if c.get("call") in chosen:
                continue
            size = 400 + reading.length(c.get("reply")) + sum(reading.length(m.get("content"))
                                                              for m in c.get("messages") or [])
            if size > budget:
                if k < len(behind):
                    continue
                break
            budget -= size
            chosen.add(c.get("call"))
        return chosen


def group_anchor(c: dict) -> str:
    """The anchor of the calls an island made for one generation (or after it, for a crossover)."""
    if c.get("stage") == "setup" or c.get("island") is None:
        return "xg-setup"
    return f"{'xc' if c.get('stage') == 'crossover' else 'xg'}-{c.get('island')}-{c.get('generation')}"


def _short_purpose(purpose) -> str:
    return PURPOSES.get(purpose, str(purpose)).split(" (")[0]


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _e(x) -> str:
    return escape("" if x is None else str(x))

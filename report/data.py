"""A run directory read back for report.html: config.json, checkpoint.json, events.jsonl, evals/ and
candidates/, joined into one picture of the search (paper §3, Algorithms 1 and 2).

    run = data.load(Path("runs/conv_groupnorm-20260101-120000"))   # from report import data
    run.generations, run.actions, run.candidates, run.islands, run.past_ideas(i), run.lineage(pid)

It works for a finished, running or killed run: every file may be missing or a line short, and event
kinds or fields it does not know are kept (run.other_events) and never an error. The checkpoint holds
the state at the last finished round; events written after it still show in the history and the chart.

Joins made here:
  - a candidate's island, generation, idea and experiment come from the generation event naming it
    (its `program`, or one of its `attempts`: the first attempt was written from the generation's
    `parent`, each repair from the attempt before it);
  - a generation's idea text comes from the island's permanent log (never rolled back), matched in
    order by experiment, because a backtrack restores an older pool whose idea ids get reused;
  - snapshot k of an island is labelled with the generation it was saved after (one per generation,
    one after each backtrack), so "backtrack to snapshot 3" reads "back to the state after generation 2";
  - LLM exchanges (transcript.jsonl, driver/transcript.py): a candidate's is the implementation or repair call
    whose reply carried it; a generation's are the calls its island made for it; an idea's are the calls
    that proposed it, placed it in the pool (new, or merged into it), summarised it or pruned it, read
    from the generation's notes ("new idea 3", "merged proposal 2 into idea 3", "summarised idea 3",
    "pruned ideas [3]") and a crossover's prune notes.
Standard library only (and the project's driver/transcript.py).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from driver import transcript as transcript_mod


@dataclass
class Candidate:
    """One evaluated program and everything known about where it came from."""
    id: str
    status: str = "unknown"
    runtime_ms: float | None = None   # the score: s_0 / the paired speedup (or the measured runtime)
    measured_ms: float | None = None  # the evaluator's own figures: the candidate's runtime, the reference
    beside_ms: float | None = None    # timed beside it, and their ratio, the paired speedup
    paired_speedup: float | None = None
    message: str = ""
    details: dict = field(default_factory=dict)
    time: float = 0.0
    uses: int = 0                   # evaluation events naming it (re-uses of a stored result included)
    island: int | None = None
    generation: int | None = None
    idea: int | None = None
    idea_text: str = ""
    experiment: str = ""
    parent: str | None = None       # the program it was written from (None: the reference, or not recorded)
    parent_recorded: bool = False
    repair_of: str | None = None    # set when a repair prompt produced it from that failed program
    children: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == "ok" and bool(self.runtime_ms)


@dataclass
class Run:
    path: Path
    meta: dict                       # config.json (the resolved config is meta["config"])
    checkpoint: dict                 # {} before the first round finished
    events: list[dict]
    baseline_ms: float | None
    stopped: str = ""                # report.md's "stopped:" line, when the run wrote one
    generations: list[dict] = field(default_factory=list)
    actions: list[dict] = field(default_factory=list)
    other_events: list[dict] = field(default_factory=list)
    candidates: dict[str, Candidate] = field(default_factory=dict)
    snapshot_labels: dict[int, list[str]] = field(default_factory=dict)
    transcript: transcript_mod.Reading = field(default_factory=lambda: transcript_mod.Reading({}, []))
    program_calls: dict[str, dict] = field(default_factory=dict)       # candidate id -> the call that wrote it
    generation_calls: dict[tuple, list[dict]] = field(default_factory=dict)   # (island, gen, stage) -> calls
    idea_calls: dict[tuple, list[tuple[str, dict]]] = field(default_factory=dict)   # (island, idea) -> [(what, call)]

    @property
    def config(self) -> dict:
        return self.meta.get("config") or {}

    @property
    def islands(self) -> list[dict]:
        return self.checkpoint.get("islands") or []

    @property
    def island_ids(self) -> list[int]:
        ids = {i.get("index", n) for n, i in enumerate(self.islands)}
        ids |= {e["island"] for e in self.generations + self.actions if isinstance(e.get("island"), int)}
        return sorted(ids)

    def island(self, i: int) -> dict:
        return next((d for d in self.islands if d.get("index") == i), {})

    def speedup(self, ms) -> float | None:
        return self.baseline_ms / ms if self.baseline_ms and isinstance(ms, (int, float)) and ms > 0 else None

    def best(self) -> Candidate | None:
        """The run's best as run.py's confirmed ranking crowned it; else the fastest measured one."""
        gb = self.checkpoint.get("global_best") or {}
        if gb.get("program") in self.candidates:
            return self.candidates[gb["program"]]
        ok = [c for c in self.candidates.values() if c.ok]
        if ok:
            return min(ok, key=lambda c: c.runtime_ms)
        return self.candidates.get(gb.get("program"))

    def ranked(self) -> list[Candidate]:
        """Correct candidates fastest first, then the failures in the order they were evaluated."""
        ok = sorted((c for c in self.candidates.values() if c.ok), key=lambda c: c.runtime_ms)
        return ok + sorted((c for c in self.candidates.values() if not c.ok), key=lambda c: c.time)

    def lineage(self, pid: str) -> list[Candidate]:
        """The chain of parents (and repaired programs) that led to `pid`, oldest first."""
        chain, seen = [], set()
        while pid in self.candidates and pid not in seen:
            seen.add(pid)
            c = self.candidates[pid]
            chain.append(c)
            pid = c.repair_of or c.parent
        return chain[::-1]

    def snapshot_label(self, island: int, k) -> str:
        labels = self.snapshot_labels.get(island, [])
        return labels[k] if isinstance(k, int) and 0 <= k < len(labels) else f"snapshot {k}"

    def snapshot_pool(self, island: int, k) -> dict | None:
        snaps = self.island(island).get("snapshots") or []
        return (snaps[k] or {}).get("pool") if isinstance(k, int) and 0 <= k < len(snaps) else None

    def past_ideas(self, island: int) -> list[dict]:
        """Ideas of the island's log no longer in its pool (pruned, or left behind by a backtrack):
        {"id", "description", "pruned": bool, "summary", "records": [hypothesis dicts]}."""
        d = self.island(island)
        log = d.get("log") or {}
        # Ids are never reused within an island, so an id names one idea even when a merge rewrote its text.
        current = {i.get("id") for i in (d.get("pool") or {}).get("ideas", [])}
        past: dict[int, dict] = {}
        for idea in log.get("pruned", []):
            past[idea.get("id")] = {"id": idea.get("id"), "description": idea.get("description") or "",
                                    "pruned": True, "summary": idea.get("summary", ""),
                                    "records": list(idea.get("hypotheses", []))}
        for entry in log.get("tried", []):
            idea_id = entry.get("idea_id")
            if idea_id in current or idea_id is None:
                continue
            item = past.setdefault(idea_id, {"id": idea_id, "description": entry.get("idea") or "",
                                             "pruned": False, "summary": "", "records": []})
            hyp = entry.get("hypothesis") or {}
            if hyp not in item["records"]:
                item["records"].append(hyp)
        return list(past.values())


def calls_text(usage: dict) -> str:
    """A role's LLM calls as both reports state them: "38 calls (1 set-up probe)" (a replay makes no probe:
    its counts and its transcript hold the recording's)."""
    calls, probes = int(usage.get("calls", 0)), int(usage.get("probes", 0))
    text = f"{calls:,} {'call' if calls == 1 else 'calls'}"
    return text + (f" ({probes} set-up {'probe' if probes == 1 else 'probes'})" if probes else "")


def task_name(run: Run) -> str:
    """The task's name: config.json keeps it under "task" (older runs: a name; newer: the task's settings)."""
    task = run.meta.get("task")
    if isinstance(task, dict):
        task = task.get("name")
    return str(task or run.config.get("task") or run.path.name)


def load(path: Path) -> Run:
    path = Path(path)
    meta = _json(path / "config.json") or {}
    checkpoint = _json(path / "checkpoint.json") or {}
    events = _events(path / "events.jsonl")
    run = Run(path=path, meta=meta, checkpoint=checkpoint, events=events,
              baseline_ms=checkpoint.get("baseline_ms") or _stored_baseline(path, meta))
    report_md = path / "report.md"
    if report_md.exists():
        for line in report_md.read_text(errors="replace").splitlines():
            if line.startswith("- stopped:"):
                run.stopped = line[len("- stopped:"):].strip()
    for e in events:
        kind = e.get("type")
        if kind == "generation" and isinstance(e.get("island"), int):
            run.generations.append(e)
        elif kind == "action" and isinstance(e.get("island"), int):
            run.actions.append(e)
        elif kind != "evaluation":
            run.other_events.append(e)
    _read_candidates(run)
    _attach_log_ideas(run)
    _label_snapshots(run)
    run.transcript = transcript_mod.read(path)
    _link_calls(run)
    return run


# ----------------------------------------------------------------------------- helpers

def _json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _events(path: Path) -> list[dict]:
    """Every complete line of events.jsonl; a line cut short by a kill is skipped."""
    out = []
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return out
    for line in lines:
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if isinstance(e, dict):
            out.append(e)
    return out


def _eval_dirs(run: Run) -> list[Path]:
    dirs = [run.path / "evals"]
    cache = run.config.get("eval_cache")
    if cache:
        dirs.append(Path(cache) if Path(cache).is_absolute() else run.path / cache)
        dirs.append(Path(cache))
    return [d for d in dict.fromkeys(dirs) if d.is_dir()]


def _stored_baseline(path: Path, meta: dict) -> float | None:
    run = Run(path=path, meta=meta, checkpoint={}, events=[], baseline_ms=None)
    for d in _eval_dirs(run):
        for f in d.glob("baseline-*.json"):
            ms = (_json(f) or {}).get("baseline_ms")
            if ms:
                return ms
    return None


def _candidate(run: Run, pid) -> Candidate | None:
    if not isinstance(pid, str) or not pid:
        return None
    return run.candidates.setdefault(pid, Candidate(id=pid))


def _read_candidates(run: Run) -> None:
    for e in run.events:
        if e.get("type") != "evaluation":
            continue
        c = _candidate(run, e.get("program"))
        if c is None:
            continue
        c.uses += 1
        if not c.time:
            c.time = e.get("time") or 0.0
        if not e.get("cached") or c.status == "unknown":
            c.status = e.get("status") or c.status
            c.runtime_ms = e.get("runtime_ms", c.runtime_ms)
            c.message = e.get("message") or c.message
    forced: dict[int, str] = {}   # a crossover's parent, for events written before parents were recorded
    for e in run.events:
        if e.get("type") == "action" and e.get("action") == "crossover" and isinstance(e.get("island"), int):
            forced[e["island"]] = e.get("parent")
        if e.get("type") != "generation" or not isinstance(e.get("island"), int):
            continue
        attempts = attempt_ids(e)
        if not attempts and e.get("program") and e.get("outcome"):
            attempts = [e["program"]]
        parent, recorded = (e.get("parent"), True) if "parent" in e else (forced.get(e["island"]), False)
        forced.pop(e["island"], None)
        for n, pid in enumerate(attempts):
            c = _candidate(run, pid)
            if c.generation is not None:
                continue   # the same program again (a re-used result): keep where it first came from
            c.island, c.generation, c.idea = e["island"], e.get("generation"), e.get("idea")
            c.experiment = e.get("experiment") or ""
            if n == 0:
                c.parent, c.parent_recorded = parent, recorded or parent is not None
            else:
                c.parent, c.repair_of, c.parent_recorded = parent, attempts[n - 1], True
    for d in _eval_dirs(run):
        for f in d.glob("*.json"):
            if f.name.startswith("baseline-"):
                continue
            r = _json(f) or {}
            c = run.candidates.get(r.get("program_id"))
            if c is not None and not c.details:
                c.details = r.get("details") or {}
                c.status = r.get("status") or c.status
                c.measured_ms, c.beside_ms, c.paired_speedup = r.get("runtime_ms"), r.get("baseline_ms"), r.get("speedup")
                if r.get("speedup") and run.baseline_ms:   # the run's score: s_0 / the paired speedup
                    c.runtime_ms = run.baseline_ms / r["speedup"]
                else:
                    c.runtime_ms = r.get("runtime_ms", c.runtime_ms)
                c.message = r.get("message") or c.message
    for c in run.candidates.values():
        origin = c.repair_of or c.parent
        if origin in run.candidates:
            run.candidates[origin].children.append(c.id)


def _attach_log_ideas(run: Run) -> None:
    """Gives each generation event `idea_text`: the idea's description when the experiment was logged."""
    for i in run.island_ids:
        tried = list((run.island(i).get("log") or {}).get("tried", []))
        pos = 0
        for e in (g for g in run.generations if g["island"] == i):
            for k in range(pos, min(pos + 3, len(tried))):   # a generation logs at most one entry
                hyp = tried[k].get("hypothesis") or {}
                if hyp.get("experiment") == e.get("experiment") and tried[k].get("idea_id") == e.get("idea"):
                    e["idea_text"] = tried[k].get("idea") or ""
                    pos = k + 1
                    break
    by_generation = {(e["island"], e.get("generation")): e for e in run.generations}
    for c in run.candidates.values():
        c.idea_text = by_generation.get((c.island, c.generation), {}).get("idea_text", "")


def _label_snapshots(run: Run) -> None:
    """Snapshot k of an island: 0 is the empty start, then one per generation and one per backtrack."""
    for i in run.island_ids:
        labels = ["the start (empty pool)"]
        for e in run.events:
            if e.get("island") != i:
                continue
            if e.get("type") == "generation":
                labels.append(f"the state after generation {e.get('generation')}")
            elif e.get("type") == "action" and e.get("action") == "backtrack":
                labels.append(f"the state after the backtrack at generation {e.get('generation')}")
        snaps = run.island(i).get("snapshots")
        if snaps is None or len(labels) >= len(snaps):   # events may run ahead of the checkpoint
            run.snapshot_labels[i] = labels


_IDEA_NOTES = [(re.compile(r"new idea (\d+)"), ("proposed", "idea_generation"), ("added", "classification")),
               (re.compile(r"merged proposal \d+ into idea (\d+)"), ("proposed", "idea_generation"),
                ("merged", "classification")),
               (re.compile(r"summarised idea (\d+)"), ("summarised", "summary"))]
_PRUNED = re.compile(r"pruned ideas \[([\d, ]*)\]")


def _link_calls(run: Run) -> None:
    """Joins the transcript's calls to candidates, generations and ideas (see the module docstring)."""
    for c in run.transcript.calls:
        if c.get("program") and c.get("reply") is not None:
            run.program_calls.setdefault(c["program"], c)
        key = (c.get("island"), c.get("generation"), c.get("stage"))
        run.generation_calls.setdefault(key, []).append(c)

    def last(calls: list[dict], purpose: str) -> dict | None:   # after a format reminder, the reply used
        return next((c for c in reversed(calls) if c.get("purpose") == purpose), None)

    def link(island, idea, what: str, call: dict | None) -> None:
        links = run.idea_calls.setdefault((island, int(idea)), [])
        if call is not None and (what, call) not in links:
            links.append((what, call))

    for e in run.generations:
        i, g = e["island"], e.get("generation")
        calls = run.generation_calls.get((i, g, "generation"), [])
        for note in e.get("notes") or []:
            note = str(note)
            for pattern, *whats in _IDEA_NOTES:
                m = pattern.match(note)
                if m:
                    for what, purpose in whats:
                        link(i, m.group(1), what, last(calls, purpose))
            m = _PRUNED.match(note)
            if m:
                for idea in re.findall(r"\d+", m.group(1)):
                    link(i, idea, "pruned", last(calls, "prune"))
    for a in run.actions:
        calls = run.generation_calls.get((a["island"], a.get("generation"), "crossover"), [])
        for note in a.get("pruned") or []:
            m = _PRUNED.match(str(note))
            for idea in re.findall(r"\d+", m.group(1)) if m else []:
                link(a["island"], idea, "pruned after the crossover", last(calls, "prune"))


def attempt_ids(event: dict) -> list[str]:
    """The programs a generation evaluated, in order: each attempt is {"program", "status", "score"} (or,
    in older run directories, a bare program id)."""
    ids = []
    for a in event.get("attempts") or []:
        pid = a.get("program") if isinstance(a, dict) else a
        if isinstance(pid, str):
            ids.append(pid)
    return ids

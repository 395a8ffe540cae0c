"""report.html: the page is read back with html.parser and checked against the run directory's files:
every island, idea, generation, candidate and intervention appears with its numbers, and every link
inside the page leads somewhere. `check_page` is also run on the real CPU runs of test_run.py; here
synthetic run directories cover a 1,000-generation run (size, time), a killed run and unknown events."""
from __future__ import annotations

import hashlib
import json
import random
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest

from driver import transcript
from report import data as report_data
from report import html as report_html

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "wbr"}


class _Page(HTMLParser):
    """Ids with the text inside their element, and every href."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack: list[tuple[str, str | None]] = []
        self.text: dict[str, list[str]] = {}
        self.ids: list[str] = []
        self.hrefs: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("href"):
            self.hrefs.append(a["href"])
        if a.get("id"):
            self.ids.append(a["id"])
            self.text[a["id"]] = []
        if tag not in VOID:
            self.stack.append((tag, a.get("id")))

    def handle_startendtag(self, tag, attrs):
        a = dict(attrs)
        if a.get("href"):
            self.hrefs.append(a["href"])
        if a.get("id"):
            self.ids.append(a["id"])
            self.text[a["id"]] = []

    def handle_endtag(self, tag):
        for k in range(len(self.stack) - 1, -1, -1):
            if self.stack[k][0] == tag:
                del self.stack[k:]
                return

    def handle_data(self, data):
        for _, i in self.stack:
            if i is not None:
                self.text[i].append(data)

    def of(self, anchor: str) -> str:
        assert anchor in self.text, f"no element with id {anchor!r}"
        return " ".join("".join(self.text[anchor]).split())


def parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


def _events(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines() if x.strip()]


def check_page(run_dir: Path) -> _Page:
    """Builds report.html for `run_dir` and checks it against the run's own files."""
    path = report_html.write(run_dir)
    page = parse(path)
    assert len(page.ids) == len(set(page.ids)), "duplicate ids"
    ids = set(page.ids)
    for href in page.hrefs:
        if href.startswith("#"):
            assert href[1:] in ids, f"link {href} leads nowhere"
        else:
            assert (run_dir / href).exists(), f"link {href} is not a file of the run directory"
    events = _events(run_dir)
    checkpoint = json.loads((run_dir / "checkpoint.json").read_text())
    s0 = checkpoint["baseline_ms"]
    last_eval = {}
    for e in events:
        if e["type"] == "evaluation" and not e.get("cached"):
            last_eval.setdefault(e["program"], e)
    for pid, e in last_eval.items():
        text = page.of(f"p-{pid}")
        if e["status"] == "ok":
            assert f"{s0 / e['runtime_ms']:.3f}x" in text, (pid, text)
        else:
            assert e["status"] in text and " ".join(e["message"][:80].split()) in text, (pid, text)
    for e in events:
        if e["type"] == "generation":
            i, g = e["island"], e["generation"]
            text = page.of(f"g-{i}-{g}")
            assert " ".join(e["experiment"].split()) in text
            assert f"{e['momentum']:.3f}" in text
            if e["outcome"] == "ok":
                assert f"{s0 / e['runtime_ms']:.3f}x" in text
            for pid in report_data.attempt_ids(e):
                assert f"#p-{pid}" in page.hrefs
        if e["type"] == "action":
            text = page.of(f"act-{e['island']}-{e['generation']}")
            assert e["action"] in text
            for k, w in e["weights"].items():
                assert f"{'w_BT' if k == 'backtrack' else 'w_C' + k} = {w:.3f}" in text
            assert f"{e['A_self']:.3f}" in text
    for island in checkpoint["islands"]:
        i = island["index"]
        assert f"Island {i}" in page.of(f"island-{i}")
        for idea in island["pool"]["ideas"]:
            text = page.of(f"idea-{i}-{idea['id']}")
            assert " ".join(idea["description"].split()) in text
            for h in idea["hypotheses"]:
                assert " ".join(h["experiment"].split()) in text
    best = checkpoint["global_best"]
    if best:
        assert best["program"] in page.of("best") and f"{best['speedup']:.3f}x" in page.of("best")
    check_exchanges(run_dir, page, events, last_eval)
    return page


def check_exchanges(run_dir: Path, page: _Page, events: list[dict], evaluated) -> None:
    """With a transcript: every candidate names the call whose reply carried it, and that call, when on
    the page, shows its prompt and the reply; every generation links to its calls; ideas to theirs."""
    reading = transcript.read(run_dir)
    if not reading.calls:
        assert "before LLM exchanges were kept" in page.of("exchanges")
        return
    wrote = {}
    for c in reading.calls:
        if c.get("program") and c.get("reply") is not None:
            wrote.setdefault(c["program"], c)
    shown = {i for i in page.ids if i.startswith("x-")}
    for pid in evaluated:
        c = wrote[pid]   # every evaluated program came from a recorded reply
        assert f"call {c['call']}" in page.of(f"p-{pid}")
        if f"x-{c['call']}" in shown:
            text = page.of(f"x-{c['call']}")
            assert " ".join(reading.prompt(c).split())[:300] in text
            assert " ".join(reading.text(c["reply"]).split())[:300] in text
    for e in events:
        if e["type"] == "generation" and any((c.get("island"), c.get("generation")) == (e["island"], e["generation"])
                                             and f"x-{c['call']}" in shown for c in reading.calls):
            assert f"#xg-{e['island']}-{e['generation']}" in page.hrefs
    proposed = {(e["island"], int(n.split()[2].rstrip(":"))) for e in events if e["type"] == "generation"
                for n in e.get("notes") or [] if n.startswith("new idea ")}
    linked = [a for a in proposed if f"idea-{a[0]}-{a[1]}" in page.ids]
    assert all("proposed by" in page.of(f"idea-{i}-{k}") for i, k in linked)


# ----------------------------------------------------------------------------- synthetic runs

BODY = "".join(f"    y{k} = torch.relu(x * {k}.0 + {k % 7}.0)  # step {k}\n" for k in range(120))


def _source(n: int) -> str:
    return f"import torch\n\nclass ModelNew(torch.nn.Module):\n  def forward(self, x):\n{BODY}    return x * {n}\n"


PROMPT = "".join(f"Background paragraph {k}: the device, the contract and the rules of the evaluator, "
                 f"repeated in every prompt of the run. " * 6 + "\n\n" for k in range(5))


def make_run(path: Path, generations: int, islands: int = 3, seed: int = 0) -> Path:
    """A run directory as run.py writes it, with made-up numbers: repairs, failures, interventions, and a
    transcript of the LLM calls behind them."""
    rng = random.Random(seed)
    (path / "candidates").mkdir(parents=True)
    book = transcript.Transcript()
    book.attach(path)

    def call(purpose, i, g, reply, program=None, stage="generation"):
        book.add({"time": 0.0, "stage": stage, "island": i, "generation": g, "purpose": purpose, "attempt": 0,
                  "role": "main", "model": "fake", "messages": [{"role": "user", "content": f"[pacevolve prompt: "
                  f"{purpose}]\n{PROMPT}Island {i}, generation {g}: the pool and the parent.\n"}],
                  "reply": reply, "error": None, "program": program, "tokens": {"input": 900, "output": 80},
                  "latency_s": 1.5, "retries": 0, "finish": "stop"})

    (path / "evals").mkdir()
    s0 = 4.0
    config = {"task": "synthetic", "islands": islands, "generations": generations, "eps_rel": 0.9,
              "k_idea": 5, "model": "fake", "eval_cache": None, "target_speedup": None}
    task = {"name": "synthetic", "rtol": 1e-4, "device": "cpu"}   # as driver/rundir.py writes the task's settings
    (path / "config.json").write_text(json.dumps({"config": config, "task": task, "device": "cpu",
                                                  "hardware": "a CPU", "started": "20260101-000000"}))
    events, t, n = [], 1.0e9, 0
    state = [{"best": None, "pool": {}, "tried": [], "actions": [], "snaps": 1} for _ in range(islands)]
    gbest = None
    for g in range(1, generations + 1):
        for i in range(islands):
            st = state[i]
            idea = (g // 25) % 6 + 1
            desc = f"idea {idea} of island {i}: fuse stage {idea} into one kernel"
            experiment = (f"try variant {g}.{i} of idea {idea}: keep the statistics in registers, launch one "
                          f"block per (sample, group) and read the input once with float4 loads")
            parent = st["best"][0] if st["best"] else None
            call("idea_generation", i, g, f"Idea: {desc}\nChoice: proposal 1\nExperiment: {experiment}")
            call("classification", i, g, f"Proposal 1\nIdea Exists: True\nIdea ID: {idea}")
            attempts = []
            for k in range(2 if g % 5 == 0 else 1):
                n += 1
                src = _source(n)
                pid = hashlib.sha256(src.encode()).hexdigest()[:12]
                (path / "candidates" / f"{pid}.py").write_text(src)
                call("implementation" if k == 0 else "repair", i, g, f"```python\n{src[-40:]}```\n", pid)
                fail = k == 0 and g % 5 == 0 or rng.random() < 0.1
                ms = None if fail else s0 / (0.5 + rng.random() * 2)
                status = "incorrect" if fail else "ok"
                msg = (f"incorrect on trial {n % 7} (inputs: own): output 0: elementwise bound rtol*|ref|+atol*"
                       f"RMS(ref) exceeded; relative L2 error {rng.random():.3g} > 1e-05; worst at index [11, 0, 9, "
                       f"26]: got 2.66461, expected 2.44488" if fail else f"ok: {s0 / ms:.3g}x")
                t += 1
                events.append({"type": "evaluation", "time": t, "program": pid, "status": status,
                               "runtime_ms": ms, "message": msg})
                (path / "evals" / f"{pid}x.json").write_text(json.dumps(
                    {"status": status, "runtime_ms": ms, "message": msg, "program_id": pid, "details": {
                        "timing": {"samples_ms": [ms or 1.0] * 100, "median_ms": ms}, "check_s": 0.1}}))
                attempts.append((pid, status, ms, msg))
            pid, status, ms, msg = attempts[-1]
            if ms and (st["best"] is None or ms < st["best"][1]):
                st["best"] = (pid, ms)
            if ms and (gbest is None or ms < gbest["runtime_ms"]):
                gbest = {"program": pid, "runtime_ms": ms, "speedup": s0 / ms, "island": i, "generation": g}
            hyp = {"experiment": experiment, "program_id": pid, "status": status, "score": ms,
                   "result": msg, "attempts": [a[0] for a in attempts]}
            st["pool"].setdefault(idea, {"id": idea, "description": desc, "hypotheses": [], "tried": 0})
            st["pool"][idea]["hypotheses"] = (st["pool"][idea]["hypotheses"] + [hyp])[-20:]
            st["tried"].append({"idea_id": idea, "idea": desc, "hypothesis": hyp})
            events.append({"type": "generation", "time": t, "island": i, "generation": g, "round": g,
                           "idea": idea, "experiment": experiment, "status": "evaluated", "outcome": status,
                           "message": msg, "runtime_ms": ms, "program": pid, "parent": parent,
                           "attempts": [{"program": a[0], "status": a[1], "score": a[2]} for a in attempts],
                           "r_t": rng.random(),
                           "momentum": rng.random(), "island_best_ms": st["best"][1] if st["best"] else s0,
                           "llm_calls": 4, "notes": [f"new idea {idea}"], "a_field_from_the_future": [1],
                           "models": {"fake": 3 + len(attempts)}, "usd": 0.001 * (1 + g % 7)})
            st["snaps"] += 1
        for i in range(islands):
            if g % 40 == i + 10 and islands > 1:
                j = (i + 1) % islands
                w = {"backtrack": rng.random(), **{str(x): rng.random() for x in range(islands) if x != i}}
                a = {"generation": g, "round": g, "A_self": rng.random(),
                     "A_others": {str(x): rng.random() for x in range(islands) if x != i}, "weights": w}
                if g % 80 < 40 or state[j]["best"] is None:
                    k = rng.randrange(state[i]["snaps"])
                    a.update(action="backtrack", restored_index=k, ideas=0)
                    state[i]["snaps"] += 1
                else:
                    a.update(action="crossover", partner=j, parent=state[j]["best"][0], merged_ideas=[],
                             pruned=[])
                state[i]["actions"].append(a)
                events.append({"type": "action", "time": t, "island": i, **a})
        if g % 25 == 0:
            events.append({"type": "llm_failure", "time": t, "island": 0, "error": "RateLimited"})
    checkpoint = {"round": generations, "baseline_ms": s0, "target_ms": 0.0, "global_best": gbest,
                  "eval_seconds": 1.0, "eval_counts": {}, "usage": {"main": {"calls": 9, "prompt_tokens": 100,
                                                                              "completion_tokens": 10}},
                  "islands": [{"index": i, "pool": {"ideas": list(st["pool"].values())[-5:]},
                               "log": {"tried": st["tried"], "pruned": []},
                               "best": {"id": st["best"][0], "score": st["best"][1]} if st["best"] else None,
                               "snapshots": [{"pool": {"ideas": []}, "elites": []}] * st["snaps"],
                               "actions": st["actions"]} for i, st in enumerate(state)]}
    paid = sum(e["usd"] for e in events if e["type"] == "generation")
    (path / "spend.json").write_text(json.dumps({"total_usd": paid + 0.0001, "prices": {"fake": [1.25, 10]},
                                                 "models": {"fake": {"calls": n + 2 * generations * islands,
                                                                     "input": 900, "output": 80, "usd": paid}}}))
    (path / "checkpoint.json").write_text(json.dumps(checkpoint))
    (path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return path


def test_small_synthetic_run_checks_out(tmp_path):
    out = make_run(tmp_path / "run", generations=60)
    page = check_page(out)
    assert "llm_failure: 2" in page.of("other-events")   # an event kind the page does not know
    html = (out / "report.html").read_text()
    assert "<h1>pacevolve run: synthetic</h1>" in html and "'rtol'" not in html
    assert "k_idea=5" in html and "target_speedup=None" not in html   # a setting left at None is not listed
    assert "What each improvement of the best cost" in page.of("cost")


def test_thousand_generations_stay_small_and_quick(tmp_path):
    run_dir = make_run(tmp_path / "run", generations=1000)
    t0 = time.perf_counter()
    path = report_html.write(run_dir)
    seconds = time.perf_counter() - t0
    size = path.stat().st_size
    print(f"1000 generations x 3 islands: {size / 1e6:.2f} MB in {seconds:.2f} s")
    assert size < 6e6
    assert seconds < 30
    page = parse(path)
    ids = set(page.ids)
    assert all(h[1:] in ids for h in page.hrefs if h.startswith("#"))
    assert any(h.startswith("candidates/") for h in page.hrefs)   # sources beyond the best N: linked
    assert "more calls not on this page" in page.of("exchanges")   # exchanges beyond the budget: named
    shown = [i for i in page.ids if i.startswith("x-")]
    assert 20 < len(shown) < len(transcript.read(run_dir).calls) / 10


def test_killed_run_without_checkpoint_or_report(tmp_path):
    run_dir = make_run(tmp_path / "run", generations=8)
    (run_dir / "checkpoint.json").unlink()
    with open(run_dir / "events.jsonl", "a") as f:
        f.write('{"type": "generation", "island": 0, "gener')   # a line cut short by the kill
    page = parse(report_html.write(run_dir))
    assert "no checkpoint yet" in page.of("run") and "--resume" in page.of("run")
    assert "g-2-8" in page.ids


def test_missing_fields_and_empty_directory(tmp_path):
    run_dir = tmp_path / "bare"
    run_dir.mkdir()
    (run_dir / "events.jsonl").write_text(
        '{"type": "generation", "island": 0}\n{"type": "evaluation", "program": "abc"}\n'
        '{"type": "action", "island": 0, "action": "teleport"}\n[1, 2]\n')
    page = parse(report_html.write(run_dir))
    assert "p-abc" in page.ids and "No correct candidate yet." in page.of("best")
    assert report_data.load(tmp_path / "nothing-here").candidates == {}


def test_lineage_follows_parents_and_repairs(tmp_path):
    run = report_data.load(make_run(tmp_path / "run", generations=12, islands=1))
    best = run.best()
    chain = run.lineage(best.id)
    assert chain[-1] is best and chain[0].parent is None
    for older, newer in zip(chain, chain[1:]):
        assert (newer.repair_of or newer.parent) == older.id
        assert newer.id in older.children
    repaired = [c for c in run.candidates.values() if c.repair_of]
    assert repaired and all(run.candidates[c.repair_of].status == "incorrect" for c in repaired)


def test_a_replay_says_so_and_whose_figures_it_shows(tmp_path):
    out = make_run(tmp_path / "run", generations=4)
    meta = json.loads((out / "config.json").read_text())
    meta["config"]["replay"] = "examples/some_recording"
    (out / "config.json").write_text(json.dumps(meta))
    check_page(out)
    html = (out / "report.html").read_text()
    assert "of examples/some_recording: the LLM's replies, s_0 and the figures below are the recording's" in html
    assert "as the recording measured it" in html and "measured at the start on the same device" not in html

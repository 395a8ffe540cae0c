"""The transcript (driver/transcript.py): every LLM request of a run is one record with the right purpose, texts
come back exactly, long texts are stored once, and a kill or a resume leaves a consistent file. The runs
here are run.main in-process against a local OpenAI-compatible server (fake_llm.OpenAIServer) with an
instant fake evaluator, so they take a few seconds."""
from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from driver import llm_check, startup, transcript
import hcm
import llm
import run
from fake_llm import OpenAIServer, RuleBasedLLM
from http_fixtures import ScriptedServer
from test_search import PROGRAMS, FakeEvaluator

SECRET = "sk-test-secret-7d1c3e9a"


class InstantEvaluator(FakeEvaluator):
    """test_search's fake evaluator with what run.main needs besides evaluate()."""

    def baseline_ms(self):
        return 20.0

    def close(self):
        pass


def run_main(monkeypatch, argv: list[str]) -> int:
    monkeypatch.setattr(startup, "make_evaluator", lambda *a, **k: InstantEvaluator())
    return run.main(argv)


def record(monkeypatch, out: Path, generations: int = 5, seed: int = 3, llm=None, more=()) -> list[str]:
    """A search of 2 islands by the rule-based LLM (or `llm`) over HTTP; returns the prompts the server was
    sent."""
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    with OpenAIServer(llm or RuleBasedLLM(PROGRAMS, seed=seed, variants=True)) as server:
        rc = run_main(monkeypatch, ["--task", "conv_groupnorm_small", "--islands", "2", "--generations",
                                    str(generations), "--base-url", server.url, "--model", "fake-model",
                                    "--freeze", "2", "--eps-rel", "0.95", "--k-idea", "3", "--seed", str(seed),
                                    "--out", str(out), "--quiet", *more])
    assert rc == 0
    return server.requests


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    try:
        out = tmp_path_factory.mktemp("transcript") / "run"
        requests = record(mp, out)
    finally:
        mp.undo()
    return out, requests


def test_one_record_per_request_the_server_saw(recorded):
    out, requests = recorded
    reading = transcript.read(out)
    prompts = [reading.prompt(c) for c in reading.calls]
    assert len(reading.calls) == len(requests)
    assert Counter(prompts) == Counter(requests)
    assert [c["call"] for c in reading.calls] == list(range(1, len(requests) + 1))


def test_purposes_are_where_the_calls_came_from(recorded):
    out, _ = recorded
    reading = transcript.read(out)
    events = [json.loads(x) for x in (out / "events.jsonl").read_text().splitlines()]
    probe, *search = reading.calls
    assert (probe["purpose"], probe["stage"], probe["island"]) == ("probe", "setup", None)
    assert reading.prompt(probe) == llm_check.PROBE_PROMPT
    for c in search:
        assert c["purpose"] == hcm.prompt_kind(reading.prompt(c))
    # HCM's own count of its calls per generation, by prompt kind, is the transcript's
    for e in (e for e in events if e["type"] == "generation"):
        mine = [c for c in search if (c["island"], c["generation"], c["stage"]) == (e["island"], e["generation"],
                                                                                     "generation")]
        assert Counter(c["purpose"] for c in mine) == Counter(e["calls"]), e["generation"]
    crossovers = [e for e in events if e["type"] == "action" and e["action"] == "crossover"]
    after = [c for c in search if c["stage"] == "crossover"]
    assert {(c["island"], c["generation"]) for c in after} <= {(e["island"], e["generation"]) for e in crossovers}
    assert all(c["purpose"] == "prune" for c in after)
    assert {"idea_generation", "classification", "implementation", "repair", "prune"} <= {c["purpose"] for c in search}


def test_records_hold_what_a_reader_needs_and_no_key(recorded):
    out, _ = recorded
    reading = transcript.read(out)
    for c in reading.calls:
        assert c["model"] == "fake-model" and c["role"] == "main" and c["error"] is None
        assert c["tokens"]["input"] > 0 and c["latency_s"] >= 0 and c["retries"] == 0
        assert c["messages"][0]["role"] == "user" and reading.text(c["reply"])
        if c["purpose"] in ("implementation", "repair"):
            assert c["program"] == hcm.program_id(hcm.extract_code(reading.text(c["reply"])))
            assert (out / "candidates" / f"{c['program']}.py").exists()
    assert SECRET not in (out / transcript.FILE).read_text()
    assert "Bearer" not in (out / transcript.FILE).read_text()


def test_long_texts_are_stored_once(recorded):
    out, requests = recorded
    lines = (out / transcript.FILE).read_text().splitlines()
    texts = [json.loads(x) for x in lines if x.startswith('{"text"')]
    assert len({t["text"] for t in texts}) == len(texts)
    raw = sum(len(p) for p in requests)
    size = (out / transcript.FILE).stat().st_size
    print(f"{len(requests)} requests, {raw:,} characters of prompts; transcript {size:,} bytes with the replies")
    assert size < raw   # the background, the reference and the parents are kept once


def test_a_failed_call_is_recorded_with_its_error_and_retries(tmp_path):
    server = ScriptedServer()
    try:
        ok = {"choices": [{"message": {"content": "Repeat: no"}, "finish_reason": "stop"}],
              "usage": {"prompt_tokens": 12, "completion_tokens": 3}}
        server.add(503, {"error": {"message": "overloaded"}})
        server.add(200, ok)
        server.add(401, {"error": {"message": "Incorrect API key provided"}})
        client = llm.Client("openai", "m", server.url + "/v1", api_key=SECRET, sleep=lambda s: None)
        book = transcript.Transcript()
        book.attach(tmp_path)
        ask = book.recorder(client, role="secondary", island=1, generation=4)
        assert ask("[pacevolve prompt: duplicate_check]\nIs it a repeat?", purpose="duplicate_check") == "Repeat: no"
        with pytest.raises(llm.AuthError):
            ask("[pacevolve prompt: summary]\nSummarise.", purpose="summary", attempt=1)
    finally:
        server.close()
    first, second = transcript.read(tmp_path).calls
    assert (first["retries"], first["tokens"]["input"], first["error"]) == (1, 12, None)
    assert (second["reply"], second["attempt"], second["purpose"]) == (None, 1, "summary")
    assert second["error"].startswith("AuthError: ") and SECRET not in second["error"]


def test_a_call_never_sent_is_not_recorded(tmp_path):
    watch = llm_check.FailureWatch(limit=1)
    watch.in_a_row = 1   # tripped: the next call fails at once, without a request
    book = transcript.Transcript()
    book.attach(tmp_path)
    ask = book.recorder(watch.wrap(lambda p: "never", 0), role="main", island=0, generation=1)
    with pytest.raises(llm_check.LLMStopped):
        ask("a prompt", purpose="selection")
    assert transcript.read(tmp_path).calls == []


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(alphabet=st.sampled_from("ab \n\n\U0001f600é\ud800x"), max_size=400), min_size=1,
                max_size=6))
def test_texts_come_back_exactly(tmp_path_factory, texts):
    path = tmp_path_factory.mktemp("prop")
    book = transcript.Transcript()
    book.attach(path)
    for t in texts:
        book.add({"purpose": "x", "messages": [{"role": "user", "content": t}], "reply": t[::-1]})
    reading = transcript.read(path)
    assert [reading.prompt(c) for c in reading.calls] == texts
    assert [reading.text(c["reply"]) for c in reading.calls] == [t[::-1] for t in texts]
    ids = [json.loads(x)["text"] for x in (path / transcript.FILE).read_text().splitlines()
           if x.startswith('{"text"')]
    assert len(ids) == len(set(ids))


def test_a_partial_last_line_is_dropped_and_numbering_goes_on(tmp_path):
    book = transcript.Transcript()
    book.add({"purpose": "probe", "messages": [{"role": "user", "content": "p" * 300}], "reply": "OK"})
    book.attach(tmp_path)   # what waited for the directory is written first
    with open(tmp_path / transcript.FILE, "a") as f:
        f.write('{"call": 2, "purpose": "sel')   # a kill mid-write
    again = transcript.Transcript()
    again.attach(tmp_path)
    again.add({"purpose": "selection", "messages": [{"role": "user", "content": "p" * 300 + "q"}], "reply": "r"})
    calls = transcript.read(tmp_path).calls
    assert [c["call"] for c in calls] == [1, 2] and calls[1]["purpose"] == "selection"
    assert all(json.loads(x) for x in (tmp_path / transcript.FILE).read_text().splitlines())


def test_rewind_drops_the_calls_after_the_checkpoint_and_keeps_this_session(tmp_path):
    first = transcript.Transcript()
    first.attach(tmp_path)
    for k in range(3):
        first.add({"purpose": "selection", "messages": [{"role": "user", "content": f"{k}" * 100}], "reply": "r"})
    checkpoint = first.lines
    first.add({"purpose": "implementation", "messages": [{"role": "user", "content": "lost " * 40}], "reply": "x"})
    resumed = transcript.Transcript()
    resumed.add({"purpose": "probe", "messages": [{"role": "user", "content": "lost " * 40}], "reply": "OK"})
    resumed.attach(tmp_path)
    resumed.rewind(checkpoint)
    resumed.add({"purpose": "implementation", "messages": [{"role": "user", "content": "new"}], "reply": "y"})
    reading = transcript.read(tmp_path)
    assert [c["purpose"] for c in reading.calls] == ["selection"] * 3 + ["probe", "implementation"]
    assert reading.prompt(reading.calls[3]) == "lost " * 40   # its stored text survived the rewind


def test_resumed_run_rewinds_its_transcript(tmp_path, monkeypatch):
    """A run killed after its round-2 checkpoint and resumed: the transcript holds each call once."""
    out = tmp_path / "run"
    record(monkeypatch, out, generations=2)
    state = json.loads((out / "checkpoint.json").read_text())
    extra = transcript.Transcript()
    extra.attach(out)   # calls of a round 3 that was never checkpointed
    extra.add({"purpose": "selection", "stage": "generation", "island": 0, "generation": 3,
               "messages": [{"role": "user", "content": "interrupted"}], "reply": "x"})
    before = len(transcript.read(out).calls)
    with OpenAIServer(RuleBasedLLM(PROGRAMS, seed=3, variants=True)) as server:
        rc = run_main(monkeypatch, ["--resume", str(out), "--generations", "3", "--base-url", server.url])
    assert rc == 0
    calls = transcript.read(out).calls
    assert not any(c.get("messages") and c["messages"][0]["content"] == "interrupted" for c in calls)
    assert len(calls) == before - 1 + len(server.requests)
    assert state["transcript"] <= json.loads((out / "checkpoint.json").read_text())["transcript"]


def test_report_md_and_html_show_the_exchanges_of_a_real_search(recorded):
    out, requests = recorded
    from report import html as report_html
    from test_report_html import check_page
    report_html.write(out)
    check_page(out)   # every candidate's exchange, every generation's calls, the ideas' calls
    report = (out / "report.md").read_text()
    reading = transcript.read(out)
    kinds = Counter(c["purpose"] for c in reading.calls)
    for purpose, n in kinds.items():
        assert f"| {purpose} | {n} | 0 | " in report


def test_the_command_lists_the_calls_and_prints_one_in_full():
    """`python -m driver.transcript DIR [N]`, as the README gives it, on the shipped example."""
    root = Path(__file__).resolve().parent.parent
    example = root / "examples" / "conv_groupnorm_small"

    def command(*args):
        return subprocess.run([sys.executable, "-m", "driver.transcript", *map(str, args)], cwd=root,
                              capture_output=True, text=True, timeout=60)
    calls = transcript.read(example).calls
    listing = command(example)
    assert listing.returncode == 0 and len(listing.stdout.splitlines()) == len(calls)
    assert listing.stdout.startswith("call 1: probe")
    one = command(example, 2)
    assert one.returncode == 0 and one.stdout.startswith("=== call 2: ") and "--- prompt\n" in one.stdout
    assert "--- reply\n" in one.stdout
    missing = command(example, len(calls) + 1)
    assert missing.returncode == 2 and f"no such call (1-{len(calls)})" in missing.stderr
    assert command().returncode == 2 and "usage: python -m driver.transcript" in command().stdout

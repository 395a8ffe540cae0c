"""`run.py --replay RUN_DIR` (driver/replay.py): a recorded search runs again with no network and reproduces its
candidates and verdicts; a changed prompt, a wrong option or a directory that is not a recording stops
it with one line. The fast tests use test_transcript's in-process runs (instant fake evaluator); the
shipped example is replayed with its recorded verdicts here, and with the real CPU evaluator in a test
marked slow."""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from driver import replay, startup, transcript
import hcm
import run
from fake_llm import RuleBasedLLM
from test_search import PROGRAMS
from test_transcript import InstantEvaluator, record, run_main

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "conv_groupnorm_small"


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    try:
        out = tmp_path_factory.mktemp("replay") / "recorded"
        record(mp, out, generations=5, seed=4)
    finally:
        mp.undo()
    return out


def sources(run_dir: Path) -> dict[str, str]:
    """Program id -> sha256 of the source, for every candidate of a run."""
    return {f.stem: hashlib.sha256(f.read_bytes()).hexdigest() for f in (run_dir / "candidates").glob("*.py")}


def verdicts(run_dir: Path) -> dict[str, str]:
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    return {e["program"]: e["status"] for e in events if e["type"] == "evaluation"}


def exchanges(run_dir: Path) -> list[tuple]:
    reading = transcript.read(run_dir)
    return sorted((c["island"], c["generation"], c["purpose"], reading.prompt(c), reading.text(c["reply"]))
                  for c in reading.calls if c["stage"] != "setup")


def test_replay_reproduces_the_candidates_and_verdicts(recording, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    out = tmp_path / "replayed"
    assert run_main(monkeypatch, ["--replay", str(recording), "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert sources(out) == sources(recording) and len(sources(out)) >= 8
    assert verdicts(out) == verdicts(recording) and set(verdicts(out).values()) == {"ok", "incorrect"}
    assert exchanges(out) == exchanges(recording)
    n = len(verdicts(recording))
    assert f"the verdict matches the recording for {n} of {n}" in said
    assert f"replay of {recording}" in (out / "report.md").read_text()
    a, b = (json.loads((d / "checkpoint.json").read_text()) for d in (recording, out))
    assert a["global_best"] == b["global_best"] and a["islands"][1]["actions"] == b["islands"][1]["actions"]
    assert a["llm"]["tokens"] == b["llm"]["tokens"] and a["usage"]["main"]["prompt_tokens"] == \
        b["usage"]["main"]["prompt_tokens"]
    # its transcript holds what its counts count: the recording's probes, marked, then the replayed calls
    replayed = transcript.read(out).calls
    assert len(replayed) == len(transcript.read(recording).calls) == b["usage"]["main"]["calls"]
    assert [c["purpose"] for c in replayed if c.get("recorded")] == ["probe"]
    assert json.loads((out / "config.json").read_text())["config"]["replay"] == str(recording)


class Flaky(RuleBasedLLM):
    """Fails every classification and prune call whose prompt hashes to 0 mod 3 (HTTP 400)."""

    def __call__(self, prompt):
        if hcm.prompt_kind(prompt) in ("classification", "prune") and self._h(prompt, "fail") % 3 == 0:
            raise RuntimeError("the scripted server refuses this prompt")
        return super().__call__(prompt)


def test_failures_and_a_secondary_model_replay_too(tmp_path, monkeypatch):
    """Recorded LLM failures are raised again (same class and message), and the secondary model's calls
    come back from the secondary model's part of the recording."""
    recorded = tmp_path / "recorded"
    record(monkeypatch, recorded, generations=5, seed=6, llm=Flaky(PROGRAMS, seed=6, variants=True),
           more=["--secondary-model", "fake-small"])
    calls = transcript.read(recorded).calls
    assert any(c["error"] for c in calls) and {c["role"] for c in calls} == {"main", "secondary"}
    monkeypatch.delenv("OPENAI_API_KEY")
    out = tmp_path / "replayed"
    assert run_main(monkeypatch, ["--replay", str(recorded), "--out", str(out), "--quiet"]) == 0
    assert sources(out) == sources(recorded) and verdicts(out) == verdicts(recorded)
    replayed = transcript.read(out).calls
    assert sorted((c["role"], c["purpose"], str(c["error"])) for c in replayed) == \
        sorted((c["role"], c["purpose"], str(c["error"])) for c in calls)   # the probes as recorded too
    a, b = (json.loads((d / "checkpoint.json").read_text()) for d in (recorded, out))
    assert a["llm"]["by_class"] == b["llm"]["by_class"] and a["llm"]["by_class"]
    assert a["usage"]["secondary"]["prompt_tokens"] == b["usage"]["secondary"]["prompt_tokens"]


def test_a_different_verdict_is_said_and_counted(recording, tmp_path, monkeypatch, capsys):
    wrong = next(pid for pid, status in verdicts(recording).items() if status == "incorrect")

    class Fixed(InstantEvaluator):   # this machine now finds the wrong program correct
        def evaluate(self, src):
            result = super().evaluate(src)
            if hcm.program_id(src) == wrong:
                result.status, result.runtime_ms = "ok", 5.0
            return result

    monkeypatch.setattr(startup, "make_evaluator", lambda *a, **k: Fixed())
    assert run.main(["--replay", str(recording), "--out", str(tmp_path / "r"), "--quiet"]) == 0
    said = capsys.readouterr()
    n = len(verdicts(recording))
    assert f"run.py: replay: candidate {wrong} is ok on this machine, incorrect in the recording" in said.err
    said = said.out
    assert f"the verdict matches the recording for {n - 1} of {n}" in said
    assert verdicts(tmp_path / "r") == verdicts(recording)   # the search went on with the recorded verdicts


def test_a_changed_prompt_stops_the_replay_naming_the_call(recording, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(hcm, "IMPLEMENT_PROMPT", hcm.IMPLEMENT_PROMPT.replace("## Your task", "## Your job"))
    assert run_main(monkeypatch, ["--replay", str(recording), "--out", str(tmp_path / "r"), "--quiet"]) == 5
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"run.py: replay of {recording} stopped: call ")
    assert ", generation 1, implementation): the prompt differs at character " in err
    assert "## Your task\\nWrite" in err and "## Your job\\nWrite" in err


@pytest.mark.parametrize("args, message", [
    (["--islands", "3"], "--replay runs with the recording's options, so --islands cannot be given"),
    (["--model", "gpt-5"], "so --model cannot be given"),
])
def test_options_a_replay_refuses(recording, tmp_path, monkeypatch, capsys, args, message):
    assert run_main(monkeypatch, ["--replay", str(recording), "--out", str(tmp_path / "r"), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()


def test_what_cannot_be_replayed_is_said_in_one_line(recording, tmp_path, monkeypatch, capsys):
    (tmp_path / "empty").mkdir()
    cases = [(tmp_path / "nothing", "no such directory"),
             (tmp_path / "empty", "no readable config.json"),
             (recording / "candidates", "no readable config.json")]
    old = tmp_path / "old"   # a run made before transcripts were kept
    old.mkdir()
    for name in ("config.json", "checkpoint.json"):
        (old / name).write_text((recording / name).read_text())
    cases.append((old, "no transcript.jsonl"))
    for path, message in cases:
        assert run_main(monkeypatch, ["--replay", str(path)]) == 2
        err = capsys.readouterr().err
        assert f"run.py: --replay {path}: {message}" in err and len(err.strip().splitlines()) == 1


def test_a_replay_cannot_be_resumed(recording, tmp_path, monkeypatch, capsys):
    out = tmp_path / "r"
    assert run_main(monkeypatch, ["--replay", str(recording), "--out", str(out), "--quiet"]) == 0
    assert run_main(monkeypatch, ["--resume", str(out)]) == 2
    assert "a replay cannot be resumed; run --replay" in capsys.readouterr().err


class RecordedVerdicts(InstantEvaluator):
    """Answers with the shipped example's own results: the LLM side of its replay, in seconds."""

    def __init__(self):
        super().__init__()
        self.results = replay.Recording.open(EXAMPLE).results

    def evaluate(self, src):
        r = self.results[hcm.program_id(src)]
        return type("R", (), {"to_dict": lambda self: dict(r)})()


def test_the_shipped_example_replays_with_todays_prompts(tmp_path, monkeypatch, capsys):
    """The README's first command. If this fails after a change to the prompts, re-record the example:
    python scripts/record_example.py. The README's "What you see" lines are the replay's own (each up to
    where the README shortens it at "..."), and so are docs/running.md's; the README's count of candidates
    is the recording's."""
    monkeypatch.setattr(startup, "make_evaluator", lambda *a, **k: RecordedVerdicts())
    out = tmp_path / "example"
    rc = run.main(["--replay", str(EXAMPLE), "--out", str(out)])
    printed = capsys.readouterr()
    assert rc == 0, printed.err
    assert sources(out) == sources(EXAMPLE) and verdicts(out) == verdicts(EXAMPLE)
    assert exchanges(out) == exchanges(EXAMPLE)
    size = sum(f.stat().st_size for f in EXAMPLE.rglob("*") if f.is_file())
    assert size < 400_000, f"the shipped example grew to {size:,} bytes"
    shown = printed.out.splitlines()
    for doc, marker in (("README.md", "From the example's recording"), ("docs/running.md", "(from the example's")):
        sample = (ROOT / doc).read_text().split(marker, 1)[1].split("```", 2)[1]
        lines = [line.split("...", 1)[0].rstrip() for line in sample.strip().splitlines()]
        assert len(lines) >= 5 and [line for line in lines if not any(p.startswith(line) for p in shown)] == [], doc
    readme = (ROOT / "README.md").read_text()
    n = len(verdicts(EXAMPLE))
    assert f"replay: {n} candidates evaluated again on this machine: the verdict matches the recording for {n} of {n}" \
        in " ".join(readme.split())


@pytest.mark.slow
def test_the_shipped_example_replays_with_the_real_evaluator(tmp_path):
    """python run.py --replay examples/conv_groupnorm_small, as the README says: the real CPU evaluator
    finds every recorded verdict again (about a minute on 2 cores)."""
    env = {k: v for k, v in __import__("os").environ.items() if "API_KEY" not in k and "BASE_URL" not in k}
    out = tmp_path / "example"
    proc = subprocess.run([sys.executable, "run.py", "--replay", str(EXAMPLE.relative_to(ROOT)), "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    n = len(verdicts(EXAMPLE))
    assert f"the verdict matches the recording for {n} of {n}" in proc.stdout
    assert sources(out) == sources(EXAMPLE) and verdicts(out) == verdicts(EXAMPLE)

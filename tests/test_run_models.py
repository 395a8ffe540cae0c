"""run.py with several main models and a dollar budget, end to end in-process: one local server answering two
scripted models of different prices and quality, a fast evaluator whose verdict reads the program. The
bandit moves to the better value, the cap stops the run, a resume with a higher cap goes on, a resume with
a changed model list keeps what is known of the models still present, and the reports say what each
improvement cost. Plus the command line's one-line refusals."""
from __future__ import annotations

import itertools
import json
import re
import threading
from pathlib import Path

import pytest

from driver import prompt_background, startup
import run
from fake_evaluator import Result
from fake_llm import OpenAIServer, RuleBasedLLM

PROGRAM = "import torch.nn as nn\n\nclass ModelNew(nn.Module):\n    LEVEL = {level}\n    VARIANT = {variant}\n"


class Writer(RuleBasedLLM):
    """A scripted model: its every `every`-th implementation is the parent one LEVEL faster (20% less
    runtime), the others are as fast as the parent (a new variant, so never a duplicate)."""

    def __init__(self, every: int, seed: int):
        super().__init__([PROGRAM.format(level=0, variant=0)], seed=seed)
        self.every, self.count, self.lock = every, itertools.count(1), threading.Lock()

    def _implementation(self, prompt: str) -> str:
        levels = re.findall(r"LEVEL = (\d+)", prompt)
        with self.lock:
            k = next(self.count)
        level = (int(levels[-1]) if levels else 0) + (k % self.every == 0)
        return f"```python\n{PROGRAM.format(level=level, variant=self._h(prompt, 'v') % 10**9)}\n```\n"

    _repair = _implementation


class Evaluator:
    """Instant verdicts: LEVEL n runs in 10 * 0.8**n ms against a 10 ms reference."""

    def baseline_ms(self, gpu=None):
        return 10.0

    def evaluate(self, src):
        level = int(re.search(r"LEVEL = (\d+)", src).group(1))
        ms = 10.0 * 0.8 ** level
        return Result("ok", ms, 10.0, 10.0 / ms, f"ok: {10 / ms:.3f}x", {"check_s": 0.0, "time_s": 0.0})

    def close(self):
        pass


@pytest.fixture
def fake_run(monkeypatch):
    monkeypatch.setattr(startup, "make_evaluator", lambda *a, **kw: Evaluator())
    monkeypatch.setattr(prompt_background, "device_facts",
                        lambda ev, device: {"kind": "cpu", "cpu": "fake", "threads": 1})
    for k in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "PACEVOLVE_MODEL"):
        monkeypatch.delenv(k, raising=False)
    # cheap: 1 improvement in 4 implementations at a tenth of the price: 2.5 times strong's value per dollar
    with OpenAIServer({"cheap": Writer(4, 1), "strong": Writer(1, 2), "mid": Writer(2, 3)}) as server:
        yield server


def _main(capsys, *args) -> tuple[int, str, str]:
    code = run.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def _generations(out: Path) -> list[dict]:
    events = [json.loads(x) for x in (out / "events.jsonl").read_text().splitlines()]
    return [e for e in events if e["type"] == "generation"]


def test_the_bandit_moves_to_the_better_value_stops_at_the_cap_and_resumes(fake_run, capsys, tmp_path):
    out, cap = tmp_path / "run", 0.2
    base = ["--task", "conv_groupnorm_small", "--islands", 2, "--base-url", fake_run.url]
    code, stdout, err = _main(capsys, *base, "--model", "cheap,strong", "--model-choice", "ucb", "--price",
                              "cheap=1/4", "--price", "strong=10/40", "--budget-usd", cap, "--generations", 12,
                              "--max-output-tokens", 512, "--seed", 0, "--out", out)
    assert code == 0, err
    assert "LLM prices, US$ per million input/output tokens: cheap 1/4 (--price), strong 10/40 (--price); " \
           "budget $0.20" in stdout
    assert re.search(r"\] idea \d+: .*  by (cheap|strong)( \d+, (cheap|strong) \d+)?  \$[\d.]+ of \$0.20\n", stdout)
    assert "done: dollar budget reached: $" in stdout
    assert f"run.py: to go on: python run.py --resume {out} --budget-usd X, with X above $" in stdout
    ledger = json.loads((out / "spend.json").read_text())
    stopped_at = json.loads((out / "checkpoint.json").read_text())["round"]
    assert 2 <= stopped_at < 12 and ledger["total_usd"] <= cap        # no call passed the cap
    assert sum(m["calls"] for m in ledger["models"].values()) == len(fake_run.requests)

    asked = len(fake_run.requests)   # the same cap again: nothing is asked, measured or changed
    code, stdout, _ = _main(capsys, "--resume", out, "--budget-usd", cap)
    assert code == 0 and "dollar budget reached" in stdout and "nothing was changed" in stdout
    assert len(fake_run.requests) == asked

    code, stdout, err = _main(capsys, "--resume", out, "--budget-usd", 1)
    assert code == 0, err
    assert f"resuming {out} at round {stopped_at}" in stdout and "done: all generations done" in stdout
    ledger = json.loads((out / "spend.json").read_text())
    assert cap < ledger["total_usd"] <= 1
    gens = _generations(out)
    assert [e["round"] for e in gens] == [r for r in range(1, 13) for _ in range(2)]

    # the bandit: both models tried, then mostly the better value per dollar
    calls = {r: {} for r in range(1, 13)}
    for e in gens:
        for m, n in e["models"].items():
            calls[e["round"]][m] = calls[e["round"]].get(m, 0) + n
    late = [calls[r].get("cheap", 0) / sum(calls[r].values()) for r in range(7, 13)]
    assert sum(late) / len(late) > 0.75, calls
    assert sum(c.get("strong", 0) for c in calls.values()) > 0
    stats = json.loads((out / "checkpoint.json").read_text())["models"]
    assert stats["kind"] == "ucb" and stats["stats"]["cheap"]["calls"] > stats["stats"]["strong"]["calls"]
    assert stats["stats"]["cheap"]["gain"] / stats["stats"]["cheap"]["usd"] > \
        stats["stats"]["strong"]["gain"] / stats["stats"]["strong"]["usd"]

    # the reports: what each improvement cost, per model, the choices over rounds, each candidate's cost
    report = (out / "report.md").read_text()
    assert "## LLM cost" in report and "What each improvement of the best cost:" in report
    dollars = r"(\$[\d.]+)"
    rows = re.findall(rf"^\| (\d+) \| (\d) \| (\w{{12}}) \| ([\d.]+)x \| (.+?) \| {dollars} \| {dollars} \| {dollars} \|$",
                      report, re.M)
    speedups = [float(r[3]) for r in rows]
    assert rows and speedups[0] > 1 and speedups == sorted(set(speedups))   # each one beats the last
    assert "| cheap | 1/4 |" in report and "| strong | 10/40 |" in report
    assert "the bandit's choices (--model-choice ucb)" in report
    page = (out / "report.html").read_text()
    assert '<section id="cost"><h2>LLM cost</h2>' in page and '<a href="#cost">LLM cost</a>' in page
    candidates = len(list((out / "candidates").glob("*.py")))
    assert re.findall(r'<tr id="p-\w+">.*<span class="cost">\$[\d.]+: (?:cheap|strong) \d', page) and \
        page.count('<span class="cost">$') == candidates + page.count("(its generation's calls)")   # table, cards
    calls_made = [json.loads(x) for x in (out / "transcript.jsonl").read_text().splitlines() if '"call"' in x]
    assert all(c["usd"] > 0 for c in calls_made if c["reply"] is not None)

    # a changed model list: the models still present keep their statistics, a new one starts fresh
    before = stats["stats"]["cheap"]
    code, stdout, err = _main(capsys, "--resume", out, "--generations", 13, "--model", "cheap,mid",
                              "--price", "mid=3/12")   # added to the saved prices
    assert code == 0, err
    after = json.loads((out / "checkpoint.json").read_text())["models"]["stats"]
    assert set(after) == {"cheap", "mid"} and after["cheap"]["calls"] >= before["calls"]
    assert after["mid"]["calls"] > 0 and "by mid" in stdout   # untried: chosen first
    assert "cheap 1/4 (--price), mid 3/12 (--price); budget $1.00" in stdout
    assert json.loads((out / "config.json").read_text())["config"]["price"] == \
        ["cheap=1/4", "strong=10/40", "mid=3/12"]


def test_an_ensemble_draws_by_weight_and_a_local_server_costs_nothing(fake_run, capsys, tmp_path):
    out = tmp_path / "run"
    code, stdout, err = _main(capsys, "--task", "conv_groupnorm_small", "--islands", 2, "--generations", 3,
                              "--base-url", fake_run.url, "--model", "cheap=0.8,strong=0.2", "--out", out)
    assert code == 0, err
    assert "LLM prices" not in stdout and "$" not in stdout    # local and unpriced by hand: nothing to pay
    ledger = json.loads((out / "spend.json").read_text())
    assert ledger["total_usd"] == 0 and ledger["prices"] == {"cheap": [0, 0], "strong": [0, 0]}
    calls = ledger["models"]
    assert calls["cheap"]["calls"] > calls["strong"]["calls"]
    assert "## LLM cost" in (out / "report.md").read_text()   # several models: the choices are shown


@pytest.mark.parametrize("args, message", [
    (["--model", "a,,b"], "--model 'a,,b': a model without a name"),
    (["--model", "a=0.7,b"], "give every model a weight"),
    (["--model", "a=0.7,b=0.3", "--model-choice", "ucb"], "--model-choice ucb chooses by improvement per dollar"),
    (["--model", "a", "--price", "a=1"], "expected MODEL=IN/OUT"),
    (["--model", "a", "--budget-usd", "0"], "must be a number > 0"),
    (["--model", "a", "--model-choice", "ubc"], "did you mean ucb?"),
])
def test_bad_model_options_are_one_line(args, message, capsys):
    with pytest.raises(SystemExit) as e:
        run.main(["--task", "conv_groupnorm_small", *args])
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and err.count("\n") == 1


def test_a_dollar_budget_needs_every_price(capsys, tmp_path, monkeypatch):
    for k in ("OPENAI_BASE_URL", "PACEVOLVE_MODEL"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    args = ["--task", "conv_groupnorm_small", "--out", tmp_path / "r", "--base-url", "https://llm.example.com/v1"]
    code, _, err = _main(capsys, *args, "--model", "mine", "--budget-usd", 5)
    assert code == 2 and err == ("run.py: --budget-usd 5: the price of mine is unknown, so its calls cannot be "
                                 "counted in dollars; give it with --price mine=IN/OUT (US dollars per million "
                                 "input/output tokens) or add it to prices.txt\n")
    code, _, err = _main(capsys, *args, "--model", "gpt-5,mine", "--model-choice", "ucb")
    assert code == 2 and "--model-choice ucb weighs improvement per dollar, but the price of mine is unknown" in err
    assert not (tmp_path / "r").exists()

"""Stopping run.py at any moment never changes a verdict: Ctrl-C (SIGINT to the process group) and SIGTERM
during builds, trials, timing, LLM calls and checkpoint writes, each resumed, against an uninterrupted run.

The fast test runs run.main in processes forked from this one (torch and matplotlib already imported, so a
run starts in milliseconds) with tests/fake_evaluator.py, which breaks under a stop the way the real
evaluator did (false verdicts from killed workers and from being closed mid-evaluation). Each process is
its own process group and gets real signals; the moment is chosen by counting phases inside it. The slow
test does the same with `python run.py` and the real evaluator."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import pytest

import background
import llm
import run
import rundir
from fake_evaluator import FakeEvaluator
from fake_llm import RuleBasedLLM
from test_run import PROGRAMS, _comparable, _serve

ROOT = Path(__file__).resolve().parent.parent
NONFINITE = PROGRAMS[0].replace("def forward(self, x):", "def forward(self, x):  # NONFINITE")
MOMENTS = ("build", "trials", "timing", "llm", "checkpoint")


@dataclass
class Moment:
    phase: str        # one of MOMENTS
    k: int            # at the k-th time this process reaches the phase ...
    delay_s: float    # ... this much later
    how: str          # "ctrl-c": SIGINT to the process group; "kill": SIGTERM to the process


class _Trigger:
    def __init__(self, moment: Moment | None):
        self.moment, self.count, self._lock = moment, 0, threading.Lock()

    def hit(self, phase: str) -> None:
        m = self.moment
        if m is None or phase != m.phase:
            return
        with self._lock:
            self.count += 1
            if self.count != m.k:
                return
        threading.Timer(m.delay_s, self._send).start()

    def _send(self) -> None:
        if self.moment.how == "ctrl-c":
            os.killpg(os.getpgrp(), signal.SIGINT)
        else:
            os.kill(os.getpid(), signal.SIGTERM)


def _child(argv: list[str], moment: Moment | None) -> int:
    """In the forked process: run.main with the fake evaluator and the moment's trigger."""
    trigger = _Trigger(moment)
    evaluator = FakeEvaluator(hooks=trigger.hit)
    run.make_evaluator = lambda *args, **kw: evaluator
    background.device_facts = lambda ev, device: {"kind": "cpu", "cpu": "fake CPU", "threads": 1}
    chat, save = llm.Client.chat, rundir.RunDir.save_checkpoint

    def watched_chat(self, messages):
        trigger.hit("llm")
        return chat(self, messages)

    def watched_save(self, state):
        trigger.hit("checkpoint")
        save(self, state)

    llm.Client.chat, rundir.RunDir.save_checkpoint = watched_chat, watched_save
    return run.main([str(a) for a in argv])


def _fork_run(argv, moment: Moment | None, logs: Path, timeout: float = 120) -> tuple[int, str, str]:
    """run.main(argv) in a forked process of its own process group; returns (exit code, stdout, stderr)."""
    out_path, err_path = logs.with_suffix(".out"), logs.with_suffix(".err")
    pid = os.fork()
    if pid == 0:   # the child: never returns into pytest
        code = 99
        try:
            os.setpgid(0, 0)
            out, err = open(out_path, "w", buffering=1), open(err_path, "w", buffering=1)
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            sys.stdout, sys.stderr = out, err
            code = _child(argv, moment)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 2
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    deadline = time.time() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.time() > deadline:
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail(f"run.py {argv} did not end within {timeout} s: {err_path.read_text()[-2000:]}")
        time.sleep(0.01)
    try:   # what the run's processes left (sleep phases after a SIGTERM to the run alone) ends with it
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return os.waitstatus_to_exitcode(status), out_path.read_text(), err_path.read_text()


def _verdicts(out: Path) -> dict:
    return {p.name: json.loads(p.read_text()) for p in (out / "evals").glob("*.json")}


def _generations(out: Path) -> list:
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    return sorted((e["island"], e["generation"]) for e in events if e["type"] == "generation")


@pytest.fixture(scope="module")
def warm():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot  # noqa: F401  (imported once here, not in every forked run)
    import torch  # noqa: F401
    import report_html  # noqa: F401


def _args(url: str, out: Path, generations: int) -> list:
    return ["--task", "conv_groupnorm_small", "--islands", "2", "--generations", generations, "--base-url", url,
            "--model", "fake", "--seed", 5, "--freeze", 2, "--eps-rel", 0.95, "--out", out]


def test_twenty_interruptions_never_change_a_verdict(warm, tmp_path):
    rng = random.Random(2026)
    moments = [Moment(MOMENTS[i % len(MOMENTS)], rng.randint(1, 3), rng.uniform(0, 0.03),
                      rng.choice(["ctrl-c", "kill"])) for i in range(20)]
    generations = 6
    with _serve(RuleBasedLLM(PROGRAMS + [NONFINITE], seed=3, variants=True, stable=True)) as url:
        code, out, err = _fork_run(_args(url, tmp_path / "whole", generations), None, tmp_path / "whole")
        assert code == 0, out + err
        whole = _verdicts(tmp_path / "whole")
        assert {v.get("status") for v in whole.values()} >= {"ok", "incorrect"}
        assert "not scored" in (tmp_path / "whole" / "events.jsonl").read_text()   # a NaN runtime came up
        chains, fired = 0, 0
        while moments:
            chains += 1
            target = tmp_path / f"chain{chains}"
            code, out, err = _fork_run(_args(url, target, generations), moments[0], tmp_path / f"c{chains}-0")
            step = 0
            while code != 0:   # stopped: check it, resume with the next moment (the last resume: none)
                moment = moments.pop(0)
                fired += 1
                _check_stopped(code, err, moment, target, whole)
                step += 1
                code, out, err = _fork_run(["--resume", target], moments[0] if moments else None,
                                           tmp_path / f"c{chains}-{step}")
            if step == 0:   # the run ended before its moment came: that moment is tried on a fresh run
                moments.append(moments.pop(0))
                assert chains < 6, "moments never reached"
            assert "Traceback" not in err, err
            _check_same_search(tmp_path / "whole", target, whole)
    assert fired == 20


def _check_stopped(code: int, err: str, moment: Moment, out: Path, whole: dict) -> None:
    expected = 130 if moment.how == "ctrl-c" else 143
    line = err.strip().splitlines()[-1] if err.strip() else ""
    assert code == expected and "Traceback" not in err, (moment, code, err[-3000:])
    assert ("interrupted (Ctrl-C)" if expected == 130 else "terminated (SIGTERM)") in line, (moment, err)
    assert "--resume" in line or "during set-up" in line, line
    stored = _verdicts(out)
    for name, result in stored.items():   # every stored verdict is the uninterrupted run's
        assert whole.get(name) == result, (moment, name, result, whole.get(name))
    assert not list(out.glob("*.tmp")), moment


def _check_same_search(whole: Path, out: Path, verdicts: dict) -> None:
    assert _verdicts(out) == verdicts
    a, b = (json.loads((p / "checkpoint.json").read_text()) for p in (whole, out))
    assert _comparable(b) == _comparable(a)
    assert (out / "best.py").read_text() == (whole / "best.py").read_text()
    assert _generations(out) == _generations(whole)   # each generation exactly once in events.jsonl

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
import re
import signal
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import pytest

from driver import cli, prompt_background, rundir, startup
import llm
import run
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
    startup.make_evaluator = lambda *args, **kw: evaluator
    prompt_background.device_facts = lambda ev, device: {"kind": "cpu", "cpu": "fake CPU", "threads": 1}
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
    from report import html as report_html  # noqa: F401


def _args(url: str, out: Path, generations: int) -> list:
    return ["--task", "conv_groupnorm_small", "--islands", "2", "--generations", generations, "--base-url", url,
            "--model", "fake", "--seed", 5, "--freeze", 2, "--eps-rel", 0.95, "--out", out]


def _tree(path: Path) -> dict:
    return {str(p.relative_to(path)): (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(path.rglob("*"))
            if p.is_file()}


def test_twenty_interruptions_never_change_a_verdict(warm, tmp_path):
    rng = random.Random(2026)
    moments = [Moment(MOMENTS[i % len(MOMENTS)], rng.randint(1, 3), rng.uniform(0, 0.03),
                      rng.choice(["ctrl-c", "kill"])) for i in range(20)]
    generations = 6
    with _serve(RuleBasedLLM(PROGRAMS + [NONFINITE], seed=3, variants=True, stable=True)) as url:
        code, out, err = _fork_run(_args(url, tmp_path / "whole", generations), None, tmp_path / "whole")
        assert code == 0, out + err
        _check_console(out)
        whole = _verdicts(tmp_path / "whole")
        assert {v.get("status") for v in whole.values()} >= {"ok", "incorrect"}
        assert all(v.get("failed") == "candidate" for v in whole.values() if v.get("status") not in (None, "ok"))
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
        # a finished run resumed: it says so, and nothing is probed, measured or written
        before = _tree(target)
        code, out, err = _fork_run(["--resume", target], None, tmp_path / "finished")
        assert code == 0 and err == "" and out.strip() == (
            f"run.py: {target} is finished: {generations} of {generations} generations done, nothing to add; "
            f"nothing was changed (to go on: python run.py --resume {target} --generations N, N > {generations})")
        assert _tree(target) == before
        # a stop between the last checkpoint and its best.py (the old best left): resuming the finished run
        # brings best.py up to date from the checkpoint, and changes nothing else
        (target / "best.py").write_text("# an older best\n")
        code, out, err = _fork_run(["--resume", target], None, tmp_path / "stale-best")
        assert code == 0 and err == "" and "best.py was brought up to date with the last checkpoint" in out, out
        assert (target / "best.py").read_text() == (tmp_path / "whole" / "best.py").read_text()
        assert {k: v for k, v in _tree(target).items() if k != "best.py"} == \
            {k: v for k, v in before.items() if k != "best.py"}
    assert fired == 20


def _check_console(out: str) -> None:
    """A failed candidate's line says why; a repaired one says so; a NaN runtime is no score."""
    lines = [line for line in out.splitlines() if line.startswith("[island") and " gen " in line]
    figures = r"\d+\.\d+x (±[\d.]+%|noise not measured) \([\d.]+ ms vs reference [\d.]+ ms beside it(; mean of \d+ evaluations)?\)"
    assert any(re.search(figures + r" after 1 repair of (incorrect|runtime_error)", line) for line in lines), out
    assert any("idea" in line and ": ok, not scored (no finite runtime)" in line for line in lines), out
    assert all("nan" not in line.split("island best")[1] for line in lines if "island best" in line)


REAL_MESSAGES = [   # as the evaluator words them (CPU, conv_groupnorm_small)
    ("incorrect", "incorrect on trial 0 (inputs: own): output 0: elementwise bound rtol*|ref|+atol*RMS(ref) "
                  "exceeded; relative L2 error 0.0202 > 1e-05; worst at index [14, 0, 6, 8]: got 2.70078, expected "
                  "2.49825 (abs err 0.203, RMS(ref) 2.88)", "output 0 at [14, 0, 6, 8]: got 2.70078, expected 2.49825"),
    ("incorrect", "incorrect on trial 0 (inputs: own): output 0 has non-finite values where the reference has "
                  "none, or not the reference's inf/nan (first at index [0, 0, 0, 0]: got nan, expected 2.84346)",
     "output 0 at [0, 0, 0, 0]: got nan, expected 2.84346"),
    ("runtime_error", "forward: RuntimeError: shape '[3, -1, 7]' is invalid for input of size 49152 [candidate "
                      "line 13 in forward: return x.view(3, -1, 7)]",
     "RuntimeError: shape '[3, -1, 7]' is invalid for input of size 49152 (line 13)"),
    ("rejected", "rejected by rule 'subprocess' (no subprocesses, shell commands or sockets) at line 14: return "
                 "os.system('x')", "rule 'subprocess' (no subprocesses, shell commands or sockets) at line 14"),
]


@pytest.mark.parametrize("status,message,reason", REAL_MESSAGES, ids=["wrong", "nan", "error", "rule"])
def test_a_failed_candidates_line_says_why_in_a_few_words(status, message, reason):
    from driver import console
    import hcm
    gen = hcm.GenerationResult(status="evaluated", idea_id=2, outcome=hcm.Outcome(status, message=message),
                               attempts=[{"status": "incorrect"}, {"status": "incorrect"}, {"status": status}])
    assert console.failure_reason(status, message) == reason
    assert console.generation_result(gen, None, 1.0, []) == f"{status} ({reason}) after 2 repairs"
    ok = hcm.GenerationResult(status="evaluated", outcome=hcm.Outcome("ok", score=0.5),
                              attempts=[{"status": status}, {"status": "ok"}])
    assert console.generation_result(ok, 0.5, 1.0, ["AuthError"]) == \
        f"2.00x (0.5 ms) after 1 repair of {status} [1 LLM call failed: AuthError]"


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


# ---------------------------------------------------------------------------------------------- non-finite scores

@pytest.mark.parametrize("bad", [{"runtime_ms": float("nan"), "speedup": float("nan")},
                                 {"runtime_ms": 1.0, "speedup": float("nan")},
                                 {"runtime_ms": float("inf"), "speedup": 0.0},
                                 {"runtime_ms": 1.0, "speedup": float("inf")},
                                 {"runtime_ms": 0.0, "speedup": None},
                                 {"runtime_ms": 1.0, "speedup": 0.0}],
                         ids=["nan", "nan-speedup", "inf", "inf-speedup", "zero", "zero-speedup"])
def test_nonfinite_scores_are_never_a_best_nor_enter_momentum(bad, tmp_path):
    """An evaluator answering "ok" with a runtime or speedup that is no finite, positive number: the run
    goes on, but that candidate is no island's or the run's best, momentum sees a generation without
    improvement, nothing is stored, and every later number stays finite."""
    import tasks
    from fake_evaluator import Result

    class Evaluator:
        opts = None

        def __init__(self):
            self.calls = 0

        def evaluate(self, src):
            self.calls += 1
            return Result("ok", baseline_ms=1.0, message="ok", **bad)

    cfg = cli.Config(task="conv_groupnorm_small", islands=2, generations=3, seed=1, freeze=1, eps_rel=0.9,
                     quiet=True)
    rd = rundir.RunDir(tmp_path / "run")
    search = run.Search(cfg, tasks.get("conv_groupnorm_small"), Evaluator(), RuleBasedLLM(PROGRAMS, variants=True),
                        None, rd, baseline_ms=2.0, device="cpu")
    assert search.run() == "all generations done"
    # Each island evaluated something every generation; two islands proposing the same source share one
    # evaluation (driver/evaluations.py), so the count may fall below islands x generations.
    assert search.evals.evaluator.calls >= 3
    assert search.global_best is None
    for island in search.islands:
        assert island.best is None and [p.id for p in island.elites] == [run.REFERENCE]
        assert island.momentum.best == 2.0 and island.momentum.value < 1.0   # no progress, finite
        assert all(b == 2.0 for _, b in island.trajectory)
    assert not list(rd.evals.glob("*.json")) and not (rd.path / "best.py").exists()
    state = json.dumps(search.state())
    assert "NaN" not in state and "Infinity" not in state


# ---------------------------------------------------------------------------------------------- stopped by the LLM

def test_llm_failures_stop_with_one_stopped_line_and_exit_3(warm, tmp_path):
    from http_fixtures import ScriptedServer
    from test_run_guard import OK_REPLY
    server = ScriptedServer()
    server.add(200, OK_REPLY)   # the probe passes, then the key is revoked
    for _ in range(12):
        server.add(401, {"error": {"message": "Incorrect API key provided"}})
    try:
        code, out, err = _fork_run(["--task", "conv_groupnorm_small", "--islands", "2", "--generations", "5",
                                    "--base-url", server.url + "/v1", "--model", "fake", "--max-llm-failures", "3",
                                    "--out", tmp_path / "run"], None, tmp_path / "run")
    finally:
        server.close()
    assert code == 3, out + err
    assert out.strip().splitlines()[-1].startswith("stopped: 3 LLM calls in a row failed (last: AuthError")
    assert err.strip().startswith("run.py: stopped: 3 LLM calls in a row failed") and "--resume" in err
    report = (tmp_path / "run" / "report.md").read_text()
    assert "- stopped: 3 LLM calls in a row failed" in report and "stopped: stopped" not in report


def test_leftovers_of_a_stopped_write_and_empty_worker_logs_are_removed(tmp_path):
    rd = rundir.RunDir(tmp_path / "run")
    (rd.path / "checkpoint.json.123.456.tmp").write_text("{")
    (rd.candidates / "abc.py.1.2.tmp").write_text("x")
    rd.logs.mkdir()
    (rd.logs / "ref-0.log").write_text("")
    (rd.logs / "runner-3.log").write_text("CUDA error: ...\n")
    rd.remove_leftovers()
    assert not list(rd.path.rglob("*.tmp"))
    assert [p.name for p in rd.logs.iterdir()] == ["runner-3.log"]


# ---------------------------------------------------------------------------------------------- the real evaluator

def _expected_status(src: str) -> str:
    """What the evaluator must say about the scripted LLM's programs (tests/test_run.py): WRONG is incorrect,
    the others (honest, its variant, the slow one) are ok."""
    return "incorrect" if "torch.logsumexp(F.hardswish(torch.tanh" in src and "for _ in range" not in src else "ok"


@pytest.mark.slow
def test_twenty_interruptions_of_python_run_py_with_the_real_evaluator(tmp_path, request):
    """`python run.py` with the real evaluator, stopped 20 times at random moments (while a candidate is
    evaluated, during an LLM call, right after a checkpoint, during set-up) by Ctrl-C (SIGINT to its process
    group, as a terminal sends it) or SIGTERM, and resumed each time: no stored verdict differs from what the
    candidate deserves, none blames a killed worker or a closed evaluator, and each generation is recorded
    once. About 5 minutes on 2 cores: it runs only when asked for, with -m slow."""
    expression = request.config.getoption("markexpr") or ""
    if "slow" not in expression or "not slow" in expression:
        pytest.skip("about 5 minutes: run it with python -m pytest -m slow tests/test_run_stop.py")
    from test_run import _env
    rng = random.Random(7)
    requests = threading.Event()

    class Slow(RuleBasedLLM):
        def __call__(self, prompt):
            requests.set()
            time.sleep(0.2)   # an LLM call takes a while: a signal can land inside it
            return super().__call__(prompt)

    answer = Slow(PROGRAMS, seed=3, variants=True, stable=True)

    fired, runs = 0, 0
    with _serve(answer) as url:
        while fired < 20:
            runs += 1
            out = tmp_path / f"run{runs}"
            args = ["--task", "conv_groupnorm_small", "--islands", "2", "--generations", "3", "--base-url", url,
                    "--model", "fake", "--out", out]
            code = None
            while code != 0:
                how = rng.choice(["ctrl-c", "kill"])
                proc = subprocess.Popen([sys.executable, str(ROOT / "run.py"), *map(str, args)], cwd=ROOT,
                                        env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                        start_new_session=True)
                moment = rng.choice(["evaluation", "evaluation", "llm", "checkpoint", "setup"]) if fired < 20 else None
                if moment and _wait_for(moment, out, proc, requests, rng):
                    if how == "ctrl-c":
                        os.killpg(proc.pid, signal.SIGINT)
                    else:
                        proc.send_signal(signal.SIGTERM)
                stdout, stderr = proc.communicate(timeout=600)
                code = proc.returncode
                assert "Traceback" not in stderr, stderr
                if code != 0:
                    fired += 1
                    assert code == (130 if how == "ctrl-c" else 143), (moment, how, code, stderr)
                    assert ("interrupted (Ctrl-C)" if code == 130 else "terminated (SIGTERM)") in stderr
                _check_real_verdicts(out)
                args = ["--resume", out]
            assert _generations(out) == [(i, g) for i in (0, 1) for g in (1, 2, 3)]
            assert not [p for p in (out / "logs").glob("*") if p.stat().st_size == 0]


def _wait_for(moment: str, out: Path, proc, requests: threading.Event, rng) -> bool:
    """Wait for the moment (False when the run ended first), plus a random part of it. Never in the first
    second: a signal while Python itself starts (before run.py's first line) gets Python's own traceback."""
    time.sleep(1.0)
    deadline = time.time() + 300
    mtime = (out / "checkpoint.json").stat().st_mtime_ns if (out / "checkpoint.json").exists() else 0
    requests.clear()
    while proc.poll() is None and time.time() < deadline:
        if moment == "setup":
            time.sleep(rng.uniform(0, 5))
            return proc.poll() is None
        if moment == "llm" and requests.is_set():
            time.sleep(rng.uniform(0, 0.15))
            return proc.poll() is None
        if moment == "checkpoint" and (out / "checkpoint.json").exists() and \
                (out / "checkpoint.json").stat().st_mtime_ns != mtime:
            return proc.poll() is None
        if moment == "evaluation" and (out / "candidates").is_dir():
            evaluated = {json.loads(p.read_text()).get("program_id") for p in (out / "evals").glob("*.json")}
            if {p.stem for p in (out / "candidates").glob("*.py")} - evaluated:
                time.sleep(rng.uniform(0, 2.5))
                return proc.poll() is None
        time.sleep(0.01)
    return False


def _check_real_verdicts(out: Path) -> None:
    for path in (out / "evals").glob("*.json"):
        result = json.loads(path.read_text())
        if "program_id" not in result:
            continue   # the reference's runtime
        src = (out / "candidates" / f"{result['program_id']}.py").read_text()
        assert result["status"] == _expected_status(src), (path.name, result["status"], result.get("message"))
        if result["status"] == "ok":
            assert result["runtime_ms"] > 0 and result["runtime_ms"] < float("inf")


def test_an_evaluator_that_raises_gives_no_verdict_and_stops_the_run_after_its_round(tmp_path):
    import tasks

    class Broken:
        opts = None

        def evaluate(self, src):
            raise RuntimeError("EvaluatorError: the runner could not start (no space left on device)")

    cfg = cli.Config(task="conv_groupnorm_small", islands=2, generations=5, seed=1, quiet=True)
    rd = rundir.RunDir(tmp_path / "run")
    search = run.Search(cfg, tasks.get("conv_groupnorm_small"), Broken(), RuleBasedLLM(PROGRAMS, variants=True),
                        None, rd, baseline_ms=2.0, device="cpu")
    why = search.run()
    assert why.startswith("the evaluator failed (RuntimeError: EvaluatorError: the runner could not start")
    assert search.round == 1 and not list(rd.evals.glob("*.json"))   # nothing stored: no verdict
    events = [json.loads(line) for line in rd.events_path.read_text().splitlines()]
    lost = [e for e in events if e["type"] == "evaluation"]
    assert lost and all(e["status"] == "no_verdict" and e["failed"] == "evaluator" for e in lost)

"""run.py failing fast and keeping its run directory safe, without a search: wrong options, a dead or
misconfigured LLM server (real local HTTP servers), an existing --out, damaged checkpoints, resume rules,
the progress plot's data. Nothing here measures a kernel except the two LLM-failure and reference tests."""
from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from driver import cli, evaluations, llm_check, rundir, startup
import llm
from report import markdown
import run
import tasks
from http_fixtures import ScriptedServer

ROOT = Path(__file__).resolve().parent.parent
OK_REPLY = {"id": "x", "object": "chat.completion", "model": "m",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "OK"}}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}}


@pytest.fixture(autouse=True)
def no_keys(monkeypatch):
    for k in list(os.environ):
        if any(s in k for s in ("API_KEY", "BASE_URL", "PACEVOLVE_MODEL")):
            monkeypatch.delenv(k)


@pytest.fixture
def server():
    s = ScriptedServer()
    yield s
    s.close()


def _main(argv, capsys) -> tuple[int, str]:
    """run.main in-process: the exit code (argparse's SystemExit included) and stderr."""
    try:
        code = run.main([str(a) for a in argv])
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


def _dead_url() -> str:
    with socket.socket() as s:   # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


# ---------------------------------------------------------------------------------------------- options

def _files(tmp_path: Path) -> dict[str, Path]:
    (tmp_path / "a_dir").mkdir()
    binary = tmp_path / "binary.py"
    binary.write_bytes(b"\x7fELF\x02\x01\x01\x00\xff\xfe")
    syntax = tmp_path / "syntax.py"
    syntax.write_text("def f(:\n")
    plain = tmp_path / "plain.py"
    plain.write_text("import torch\nx = 1\n")
    return {"dir": tmp_path / "a_dir", "binary": binary, "syntax": syntax, "plain": plain}


BAD_OPTIONS = [
    (["--islands", "0"], "--islands", ">= 1"), (["--generations", "-1"], "--generations", ">= 1"),
    (["--proposals", "0"], "--proposals", ">= 1"), (["--k-idea", "0"], "--k-idea", ">= 1"),
    (["--k-hyp", "0"], "--k-hyp", ">= 1"), (["--freeze", "0"], "--freeze", ">= 1"),
    (["--beta", "5"], "--beta", "0 < beta < 1"), (["--beta", "0"], "--beta", "0 < beta < 1"),
    (["--eps-rel", "0"], "--eps-rel", "> 0"), (["--alpha", "-1"], "--alpha", "> 0"),
    (["--alpha", "x"], "--alpha", "not a number"), (["--target-speedup", "-2"], "--target-speedup", "> 1"),
    (["--target-speedup", "1"], "--target-speedup", "> 1"), (["--token-budget", "-1"], "--token-budget", ">= 1"),
    (["--max-llm-failures", "0"], "--max-llm-failures", ">= 1"), (["--rtol", "0"], "--rtol", "> 0"),
    (["--atol", "-1"], "--atol", "> 0"), (["--l2-tol", "0"], "--l2-tol", "> 0"),
    (["--reference-limit", "0"], "--reference-limit", "> 0"),
    (["--gpus", "abc"], "--gpus", "comma-separated"), (["--gpus", "0,0"], "--gpus", "distinct"),
    (["--gpus", "99"], "--gpus", "no GPU 99"),
    (["--task", "no_such_task"], "--task", "no task of that name"),
    (["--task", "{tmp}/missing.py"], "--task", "no such file"),
    (["--task", "{dir}"], "--task", "is a directory"), (["--task", "{binary}"], "--task", "not a text file"),
    (["--task", "{syntax}"], "--task", "not valid Python (line 1"),
    (["--task", "{plain}"], "--task", "not a KernelBench problem file"),
]


@pytest.mark.parametrize("args,flag,why", BAD_OPTIONS, ids=[" ".join(a) for a, _, _ in BAD_OPTIONS])
def test_each_bad_option_is_one_line_and_exit_2_before_any_directory(args, flag, why, tmp_path, capsys):
    files = _files(tmp_path)
    args = [a.format(tmp=tmp_path, **files) for a in args]
    out = tmp_path / "run"
    code, err = _main(args + ["--out", out, "--base-url", _dead_url(), "--model", "m"], capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and flag in err and why in err, err
    assert "Traceback" not in err and not out.exists()


def test_a_bad_option_from_the_command_line_prints_no_traceback(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "run.py"), "--islands", "0", "--out", str(tmp_path / "x")],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert not (tmp_path / "x").exists()


# ---------------------------------------------------------------------------------------------- LLM probe

def _probe_run(url, tmp_path, capsys, *extra) -> tuple[int, str, float]:
    out = tmp_path / "run"
    t0 = time.monotonic()
    code, err = _main(["--task", "conv_groupnorm_small", "--base-url", url, "--model", "my-model",
                       "--out", out, *extra], capsys)
    assert not out.exists()   # the probe comes before the run directory
    return code, err, time.monotonic() - t0


def test_dead_server_stops_at_once(tmp_path, capsys):
    code, err, took = _probe_run(_dead_url(), tmp_path, capsys)
    assert code == 2 and took < 15
    assert "'my-model'" in err and "TransportError" in err and "Connection refused" in err
    assert "Fix: start the server, or correct --base-url" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("status,body,headers,cls,fix", [
    (401, {"error": {"message": "Incorrect API key provided", "type": "invalid_request_error"}}, {},
     "AuthError", "API key"),
    (200, "<html><body>Welcome to nginx</body></html>", {"Content-Type": "text/html"},
     "MalformedResponse", "OpenAI-compatible"),
    (200, {"id": "x", "object": "chat.completion", "choices": []}, {}, "EmptyResponse", "OpenAI-compatible"),
    (404, {"error": {"message": "The model `my-model` does not exist"}}, {}, "ModelNotFound", "--model"),
    (429, {"error": {"message": "You exceeded your current quota", "type": "insufficient_quota"}}, {},
     "QuotaExceeded", "credit"),
], ids=["401", "html", "empty-choices", "unknown-model", "quota"])
def test_misconfigured_server_stops_with_class_message_and_fix(status, body, headers, cls, fix, server,
                                                                tmp_path, capsys):
    for _ in range(3):   # a reply the client retries is answered the same way each time
        server.add(status, body, headers)
    code, err, took = _probe_run(server.url + "/v1", tmp_path, capsys)
    assert code == 2 and took < 15, err
    line = err.strip().splitlines()[-1]
    assert "'my-model'" in line and cls in line and "Fix:" in line and fix in line, line
    message = body["error"]["message"] if isinstance(body, dict) and "error" in body else ""
    assert message in line
    assert "Traceback" not in err


def test_secondary_model_is_probed_too(server, tmp_path, capsys):
    server.add(200, OK_REPLY)
    server.add(401, {"error": {"message": "no access to this model"}})
    code, err, _ = _probe_run(server.url + "/v1", tmp_path, capsys, "--secondary-model", "small-model")
    assert code == 2 and "secondary model 'small-model'" in err and "AuthError" in err
    assert [r.json["model"] for r in server.requests] == ["my-model", "small-model"]


def test_no_provider_message_names_the_options(tmp_path, capsys):
    code, err = _main(["--task", "conv_groupnorm_small", "--model", "mystery-model", "--out", tmp_path / "x"],
                      capsys)
    assert code == 2 and "--provider" in err and "--base-url" in err and "provider=" not in err


def test_retried_then_successful_calls_do_not_count(server):
    watch = llm_check.FailureWatch(limit=2)
    client = llm.Client("openai", "m", server.url + "/v1", sleep=lambda s: None)
    wrapped = watch.wrap(client, island=1)
    for _ in range(3):
        server.add(503, {"error": {"message": "overloaded"}})   # retried by the client ...
        server.add(200, OK_REPLY)                               # ... and then answered
        assert wrapped("hi") == "OK"
    assert watch.in_a_row == 0 and not watch.tripped and watch.tokens == {"1": 18}
    server.add(401, {"error": {"message": "bad key"}})
    server.add(401, {"error": {"message": "bad key"}})
    for _ in range(2):
        with pytest.raises(llm.AuthError):
            wrapped("hi")
    assert watch.tripped and watch.by_class == {"AuthError": 2}
    with pytest.raises(llm_check.LLMStopped):   # once tripped, no more network calls
        wrapped("hi")
    assert len(server.requests) == 8


# ---------------------------------------------------------------------------------------------- run directory

def _tree(path: Path) -> dict:
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()} | {"mtimes": sorted(
                p.stat().st_mtime_ns for p in path.rglob("*"))}


def test_out_on_an_existing_run_is_refused_and_nothing_changes(tmp_path, capsys):
    out = tmp_path / "run"
    (out / "candidates").mkdir(parents=True)
    for name, text in (("config.json", "{}"), ("checkpoint.json", '{"round": 3}'), ("best.py", "# 0.987x\n"),
                       ("events.jsonl", '{"type": "generation"}\n'), ("candidates/a.py", "x = 1\n")):
        (out / name).write_text(text)
    before = _tree(out)
    code, err = _main(["--task", "conv_groupnorm_small", "--base-url", _dead_url(), "--model", "m",
                       "--out", out], capsys)
    assert code == 2 and "not empty" in err and f"--resume {out}" in err
    assert _tree(out) == before


def test_default_names_are_unique_within_a_second(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    a = rundir.RunDir.create(None, "t")
    b = rundir.RunDir.create(None, "t")
    assert a.path != b.path and a.path.parent == b.path.parent == Path("runs")


def test_damaged_checkpoint_falls_back_to_the_previous_good_one(tmp_path):
    rd = rundir.RunDir(tmp_path / "run")
    rd.save_checkpoint({"round": 1, "islands": []})
    rd.save_checkpoint({"round": 2, "islands": []})
    assert json.loads((rd.path / "checkpoint.prev.json").read_text())["round"] == 1
    (rd.path / "checkpoint.json").write_text('{"round": 3, "isla')   # truncated by a lying disk
    warnings = []
    assert rd.load_checkpoint(warn=warnings.append)["round"] == 1
    assert len(warnings) == 1 and "checkpoint.json is damaged" in warnings[0] and "previous" in warnings[0]
    (rd.path / "checkpoint.prev.json").write_text("")
    with pytest.raises(rundir.RunDirError, match="checkpoint.json is damaged.*no usable checkpoint"):
        rd.load_checkpoint()


def _saved_run(tmp_path, task_path: Path | None = None) -> Path:
    """A run directory as set-up leaves it (no search yet): config.json and reference.py."""
    task = tasks.load(str(task_path)) if task_path else tasks.get("conv_groupnorm_small")
    cfg = cli.Config(task=str(task_path) if task_path else task.name, islands=2, base_url=_dead_url(),
                     model="m", out=str(tmp_path / "run"))
    startup.new_run_dir(cfg, task, "cpu")
    return tmp_path / "run"


@pytest.mark.parametrize("damage,expected", [
    ("config", "config.json: unreadable or damaged"), ("no-config", "no config.json there"),
    ("checkpoint", "checkpoint.json is damaged"), ("reference", "reference.py: changed since the run started"),
])
def test_damaged_run_directory_is_one_line_on_resume(damage, expected, tmp_path, capsys):
    out = _saved_run(tmp_path)
    {"config": lambda: (out / "config.json").write_text('{"config": '),
     "no-config": lambda: (out / "config.json").unlink(),
     "checkpoint": lambda: (out / "checkpoint.json").write_text(""),
     "reference": lambda: (out / "reference.py").write_text("# edited\n")}[damage]()
    code, err = _main(["--resume", out], capsys)
    assert code == 2 and expected in err and len(err.strip().splitlines()) == 1, err


def test_resume_refuses_changes_that_would_corrupt_the_state(tmp_path, capsys):
    out = _saved_run(tmp_path)
    before = _tree(out)
    for args, why in ((["--islands", "3"], "number of islands"), (["--device", "cuda"], "device"),
                      (["--task", "conv_groupnorm"], "task"), (["--seed", "4"], "shaped the saved")):
        code, err = _main(["--resume", out, *args], capsys)
        assert code == 2 and args[0] in err and why in err, err
    assert _tree(out) == before


def test_resume_config_takes_new_llm_settings_and_lengths():
    saved = vars(cli.Config(model="a", base_url="http://one/v1", generations=5, islands=3))
    typed = ["--resume", "d", "--model", "b", "--base-url", "http://two/v1", "--generations", "9",
             "--islands", "3", "--token-budget", "100"]
    cfg, changes = cli.resume_config(saved, cli.parse_args(typed), cli.given_options(typed))
    assert (cfg.model, cfg.base_url, cfg.generations, cfg.islands, cfg.token_budget, cfg.out) == \
        ("b", "http://two/v1", 9, 3, 100, "d")
    assert set(changes) == {"model", "base_url", "generations", "token_budget"}   # islands: unchanged


def test_edited_or_moved_problem_file_is_noticed_and_the_copy_used(tmp_path):
    problem = tmp_path / "my_problem.py"
    problem.write_text(tasks.get("conv_groupnorm_small").reference_src)
    out = _saved_run(tmp_path, problem)
    rd = rundir.RunDir.open(out)
    config = rd.read_config()
    task, note = rd.saved_task(config)
    assert note == "" and task.reference_src == problem.read_text() and task.name == "my_problem"
    original = problem.read_text()
    problem.write_text(original.replace("eps=1e-5", "eps=1e-3"))
    task, note = rd.saved_task(config)
    assert "has changed since the run started" in note and task.reference_src == original
    problem.unlink()
    task, note = rd.saved_task(config)
    assert "is gone" in note and task.reference_src == original


def test_missing_gpu_hint_fits_the_task():
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(startup.SetupError) as e:
        startup.check_device("cuda", tasks.get("conv_groupnorm"))
    assert "--task conv_groupnorm_small" in str(e.value) and "--device cpu" not in str(e.value)
    small_on_gpu = tasks.Task("my_problem", "", "", device="cuda", source="my_problem.py")
    with pytest.raises(startup.SetupError) as e:
        startup.check_device("cuda", small_on_gpu)
    assert "--device cpu" in str(e.value)


# ---------------------------------------------------------------------------------------------- the plot

def test_progress_data_has_every_evaluation_the_lines_and_the_interventions():
    s0 = 10.0
    events = [
        {"type": "generation", "island": 0, "generation": 1, "island_best_ms": 10.0,
         "attempts": [{"status": "compile_error", "score": None}, {"status": "ok", "score": 12.5}]},
        {"type": "generation", "island": 1, "generation": 1, "island_best_ms": 5.0,
         "attempts": [{"status": "ok", "score": 5.0}]},
        {"type": "generation", "island": 0, "generation": 2, "island_best_ms": 10.0,
         "attempts": [{"status": "incorrect", "score": None}]},
        {"type": "generation", "island": 1, "generation": 2, "island_best_ms": 5.0, "attempts": []},
        {"type": "action", "island": 0, "generation": 2, "action": "crossover"},
        {"type": "evaluation", "program": "p", "status": "ok"},
    ]
    data = markdown.progress_data(events, s0)
    kinds = [(p["island"], p["generation"], p["kind"], p["speedup"]) for p in data["points"]]
    assert kinds == [(0, 1, "failed", None), (0, 1, "correct", 0.8), (1, 1, "correct", 2.0),
                     (0, 2, "incorrect", None)]
    assert data["lines"] == {0: [(0, 1.0), (1, 1.0), (2, 1.0)], 1: [(0, 1.0), (1, 2.0), (2, 2.0)]}
    assert all(isinstance(g, int) for line in data["lines"].values() for g, _ in line)
    assert data["interventions"] == [{"island": 0, "generation": 2, "action": "crossover", "speedup": 1.0}]
    assert data["reference"] == 1.0


def test_progress_plot_is_drawn(tmp_path):
    data = markdown.progress_data([{"type": "generation", "island": 0, "generation": 1, "island_best_ms": 1.0,
                                  "attempts": [{"status": "ok", "score": 1.0}]}], 2.0)
    assert markdown.plot_progress(data, "t", tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_summary_says_when_nothing_beat_the_reference():
    slower = {"runtime_ms": 12.0, "speedup": 10 / 12, "island": 0, "generation": 3}
    assert "nothing beat the reference" in markdown.best_summary(slower, 10.0)
    assert "slower" in markdown.best_summary(slower, 10.0)
    faster = dict(slower, runtime_ms=5.0, speedup=2.0)
    assert markdown.best_summary(faster, 10.0).startswith("**best: 5 ms, 2.000x")


def test_llm_failure_classes_are_read_from_the_generation_notes():
    notes = ["LLM call failed (idea_generation): AuthError: openai HTTP 401: bad key",
             "unusable selection reply: no code block",
             "LLM call failed (classification): TransportError: timed out"]
    assert llm_check.failed_classes(notes) == ["AuthError", "TransportError"]
    assert llm_check.failed_classes([]) == []


def test_ctrl_c_before_the_run_directory_exists_is_one_line(tmp_path, capsys, monkeypatch):
    def interrupted(client, role, origin=None):
        raise KeyboardInterrupt
    monkeypatch.setattr(llm_check, "probe", interrupted)
    out = tmp_path / "run"
    code, err = _main(["--task", "conv_groupnorm_small", "--base-url", _dead_url(), "--model", "m",
                       "--out", out], capsys)
    assert code == 130 and err.strip() == "run.py: interrupted (Ctrl-C) during set-up; no run directory was made"
    assert not out.exists()


def test_tolerances_logs_and_the_problem_folder_reach_the_evaluator(tmp_path, monkeypatch):
    import evaluate_kernel
    seen = {}
    monkeypatch.setattr(evaluate_kernel.Evaluator, "for_task",
                        classmethod(lambda cls, task, **kw: seen.update(kw) or "evaluator"))
    problem = tmp_path / "problems" / "my_conv.py"
    problem.parent.mkdir()
    problem.write_text(tasks.get("conv_groupnorm_small").reference_src)
    cfg = cli.parse_args(["--task", str(problem), "--rtol", "1e-3", "--l2-tol", "2e-4", "--out", str(tmp_path / "r")])
    task = cli.load_task(cfg.task)
    rd = startup.new_run_dir(cfg, task, "cpu")
    assert startup.make_evaluator(cfg, task, "cpu", rd) == "evaluator"
    assert seen["rtol"] == 1e-3 and seen["l2_tol"] == 2e-4 and "atol" not in seen   # atol: the task's
    assert seen["log_dir"] == str(rd.path / "logs") and seen["import_dirs"] == [str(problem.parent)]
    saved = json.loads((rd.path / "config.json").read_text())["config"]
    assert (saved["rtol"], saved["atol"], saved["l2_tol"]) == (1e-3, None, 2e-4)
    plain = cli.parse_args(["--task", str(problem)])
    key = evaluations.context(task.reference_src, "cpu", plain)
    assert key == evaluations.context(task.reference_src, "cpu", plain)
    assert key != evaluations.context(task.reference_src, "cpu", cfg)   # judged under other tolerances: cached apart

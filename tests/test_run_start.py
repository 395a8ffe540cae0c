"""run.py started the way a user starts it (`python run.py ...` in a subprocess): every bad start is one line,
exit 2, and nothing is made; the help is grouped with one default each and an epilog; --version; "did you
mean"; LLM fixes that name where a setting came from. Nothing here measures a kernel."""
from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from driver import cli, llm_check
import llm

ROOT = Path(__file__).resolve().parent.parent


def _env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not any(s in k for s in ("API_KEY", "BASE_URL", "PACEVOLVE_MODEL", "RAY_ADDRESS"))}
    return dict(env, PYTHONUNBUFFERED="1", **extra)


def _run(args, cwd=ROOT, env=None, prefix=()) -> subprocess.CompletedProcess:
    return subprocess.run([*prefix, sys.executable, str(ROOT / "run.py"), *map(str, args)], cwd=cwd,
                          env=env or _env(), capture_output=True, text=True, timeout=300)


def _dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/v1"


def _one_line(proc, *words):
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


# ---------------------------------------------------------------------------------------------- --out

def test_out_under_a_file_is_one_line_and_nothing_is_made(tmp_path):
    (tmp_path / "afile.txt").write_text("x")
    before = sorted(tmp_path.rglob("*"))
    line = _one_line(_run(["--task", "conv_groupnorm_small", "--base-url", _dead_url(), "--model", "m",
                           "--out", tmp_path / "afile.txt" / "sub"], cwd=tmp_path),
                     "--out", "afile.txt is a file")
    assert "--base-url" not in line   # refused before the LLM is asked
    assert sorted(tmp_path.rglob("*")) == before


@pytest.mark.parametrize("where", ["/proc/pacevolve-run", "/sys/pacevolve-run"])
def test_out_in_a_virtual_file_system_is_one_line(where, tmp_path):
    _one_line(_run(["--task", "conv_groupnorm_small", "--model", "m", "--base-url", _dead_url(), "--out", where],
                   cwd=tmp_path), f"--out {where}", "virtual file system")
    assert not os.path.exists(where)


def test_out_on_a_read_only_file_system_is_one_line(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    _need_mount_namespace()
    prefix = ["unshare", "--mount", "sh", "-c", f'mount -t tmpfs -o ro none "{ro}" && exec "$0" "$@"']
    proc = _run(["--task", "conv_groupnorm_small", "--model", "m", "--base-url", _dead_url(),
                 "--out", ro / "run"], cwd=tmp_path, prefix=prefix)
    _one_line(proc, "--out", "read-only file system")


def test_default_run_directory_in_an_unwritable_place_is_one_line(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    _need_mount_namespace()
    prefix = ["unshare", "--mount", "sh", "-c", f'mount -t tmpfs -o ro none "{ro}" && cd "{ro}" && exec "$0" "$@"']
    proc = _run(["--task", "conv_groupnorm_small", "--model", "m", "--base-url", _dead_url()], cwd=tmp_path,
                prefix=prefix)
    _one_line(proc, "--out runs/conv_groupnorm_small-", "read-only file system")


def _need_mount_namespace():
    if not shutil.which("unshare") or subprocess.run(["unshare", "--mount", "true"],
                                                     capture_output=True).returncode != 0:
        pytest.skip("no mount namespace here (needs root)")


# ---------------------------------------------------------------------------------------------- options

@pytest.mark.parametrize("args,words", [
    (["--resume", "{tmp}/run", "--out", "{tmp}/other"], ["--resume", "drop --out"]),
    (["--report", "{tmp}/run", "--task", "softmax"], ["--report DIR", "drop --task"]),
    (["--report", "{tmp}/run", "--islands", "3", "--model", "m"], ["drop --islands, --model"]),
    (["--ray-actors", "2"], ["--ray-actors works only with --ray"]),
    (["--isands", "2"], ["unrecognized arguments: --isands", "did you mean --islands?"]),
    (["--generatons=3"], ["did you mean --generations?"]),
    (["--provider", "gemnini"], ["invalid choice", "did you mean gemini?"]),
    (["--task", "conv_groupnorm_smal"], ["no task of that name", "did you mean conv_groupnorm_small?"]),
    (["--task", "softmx"], ["did you mean softmax?"]),
], ids=["resume+out", "report+task", "report+search", "ray-actors", "option", "option=", "choice", "task",
        "task2"])
def test_wrong_or_conflicting_options_are_one_line(args, words, tmp_path):
    (tmp_path / "run").mkdir()
    proc = _run([a.format(tmp=tmp_path) for a in args], cwd=tmp_path)
    _one_line(proc, *words)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"] and not any((tmp_path / "run").iterdir())


def test_help_is_grouped_with_one_default_each_and_an_epilog():
    proc = _run(["--help"])
    assert proc.returncode == 0
    text = proc.stdout
    for group in ("task:", "LLM:", "search:", "evaluation:", "output:", "cluster:", "environment:", "exit codes:"):
        assert f"\n{group}" in text, group
    assert "(default: None)" not in text and "(default: False)" not in text
    entries = re.split(r"\n  (?=-)", text.split("\nenvironment:")[0])
    assert all(e.count("(default:") <= 1 for e in entries), [e for e in entries if e.count("(default:") > 1]
    def entry(flag):
        return " ".join(text.split(f"\n  {flag}", 1)[1].split("\n  -")[0].split())
    assert "(default: 2)" in entry("--islands") and "(default: 0)" in entry("--seed")   # real defaults shown
    from evaluate_kernel.common import TARGET_CI, TIMING_S   # the evaluator's, restated in the help
    assert (f"narrowed to {100 * TARGET_CI['cuda']:g}% (GPU) or {100 * TARGET_CI['cpu']:g}% (CPU) (default: "
            f"{TIMING_S['cuda']:g} on a GPU, {TIMING_S['cpu']:g} on the CPU)") in entry("--timing-s")
    for word in ("GEMINI_API_KEY", "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_BASE_URL", "PACEVOLVE_MODEL",
                 "130", "143", "--resume"):
        assert word in text.split("\nenvironment:")[1], word


def test_version():
    proc = _run(["--version"])
    assert proc.returncode == 0 and proc.stdout.startswith(f"pacevolve {cli.VERSION}")
    assert "Python" in proc.stdout and "PyTorch" in proc.stdout and len(proc.stdout.splitlines()) == 1


# ---------------------------------------------------------------------------------------------- --ray

def test_ray_without_a_cluster_is_one_line_before_anything_is_made(tmp_path):
    pytest.importorskip("ray")
    from http_fixtures import ScriptedServer
    from test_run_guard import OK_REPLY
    server = ScriptedServer()
    server.add(200, OK_REPLY)
    try:
        proc = _run(["--task", "conv_groupnorm_small", "--base-url", server.url + "/v1", "--model", "m",
                     "--ray", "auto", "--out", tmp_path / "run"], cwd=tmp_path,
                    env=_env(RAY_ADDRESS="", TMPDIR=str(tmp_path)))
    finally:
        server.close()
    line = _one_line(proc, "--ray auto", "no Ray cluster is running", "--ray local", "--ray ray://")
    assert "--address" not in line and "RAY_ADDRESS" not in line
    assert not (tmp_path / "run").exists() and "measuring the reference" not in proc.stdout


def test_ray_and_gpus_do_not_go_together():
    with pytest.raises(cli.UsageError, match="--gpus picks this machine's GPUs"):
        cli.check_combination({"ray", "gpus"}, cli.Config(ray="auto", gpus="0"))


# ---------------------------------------------------------------------------------------------- LLM fixes

def _fix(provider: str, base_url: str, err: Exception, origin=None) -> str:
    client = llm.Client(provider, "m", base_url)
    return llm_check.fix_for(err, client, origin)


def test_a_401_fix_says_how_each_provider_sends_the_key():
    local = "http://127.0.0.1:8000/v1"
    assert "GEMINI_API_KEY or GOOGLE_API_KEY, sent in the x-goog-api-key header" in _fix(
        "gemini", local, llm.AuthError("bad key"))
    assert "OPENAI_API_KEY, sent as the bearer token" in _fix("openai", local, llm.AuthError("bad key"))
    assert "ANTHROPIC_API_KEY, sent in the x-api-key header" in _fix("anthropic", local, llm.AuthError("x"))
    assert "bearer" not in _fix("gemini", local, llm.AuthError("bad key"))


def test_fixes_name_the_variable_a_setting_came_from():
    local = "http://127.0.0.1:9/v1"
    env = llm_check.Origin(model="PACEVOLVE_MODEL", base_url="OPENAI_BASE_URL")
    dead = _fix("openai", local, llm.TransportError("refused"), env)
    assert "correct OPENAI_BASE_URL (now http://127.0.0.1:9/v1)" in dead and "--base-url" not in dead
    unknown = _fix("openai", local, llm.ModelNotFound("no such model"), env)
    assert "check PACEVOLVE_MODEL (now m" in unknown and "--model" not in unknown
    assert "correct --base-url" in _fix("openai", local, llm.TransportError("refused"))


def test_openai_base_url_from_the_environment_is_blamed_by_name(tmp_path):
    url = _dead_url()
    proc = _run(["--task", "conv_groupnorm_small", "--model", "m", "--out", tmp_path / "run"], cwd=tmp_path,
                env=_env(OPENAI_BASE_URL=url))
    line = _one_line(proc, "TransportError", f"correct OPENAI_BASE_URL (now {url})")
    assert "--base-url" not in line and not (tmp_path / "run").exists()


def test_every_providers_connection_failure_is_one_short_line(tmp_path):
    port = _dead_url().rsplit(":", 1)[1].split("/")[0]
    lines = []
    for provider, model in (("gemini", "gemini-2.5-pro"), ("openai", "gpt-5"), ("anthropic", "claude-sonnet-4-5")):
        proc = _run(["--task", "conv_groupnorm_small", "--model", model, "--provider", provider, "--base-url",
                     f"http://127.0.0.1:{port}/some/long/path/v1beta", "--out", tmp_path / "run"], cwd=tmp_path,
                    env=_env(GEMINI_API_KEY="k", OPENAI_API_KEY="k", ANTHROPIC_API_KEY="k"))
        lines.append(_one_line(proc, "no connection", "Connection refused", "127.0.0.1", "Fix:"))
    assert max(map(len, lines)) < 330, lines
    assert not (tmp_path / "run").exists()


def test_a_transport_error_names_host_and_cause_not_the_whole_chain():
    client = llm.Client("gemini", "gemini-2.5-pro", _dead_url() + "beta", api_key="k", max_retries=0)
    with pytest.raises(llm.TransportError) as e:
        client("hi")
    assert "Connection refused" in str(e.value) and "HTTPConnectionPool" not in str(e.value)
    assert len(str(e.value)) < 120, str(e.value)


def test_third_party_warnings_go_to_the_runs_log_not_the_console(tmp_path, capsys):
    import logging
    import warnings

    from driver import rundir
    from driver.startup import RunLog
    log = RunLog()
    try:
        ray_like = logging.getLogger("ray")
        before = list(ray_like.handlers)
        own = logging.StreamHandler(sys.stderr)
        ray_like.addHandler(own)   # a library that prints on its own handler, as Ray does
        log.adopt("ray")
        ray_like.warning("Token authentication is enabled for this Ray cluster")   # before the directory exists
        rd = rundir.RunDir(tmp_path / "run")
        log.attach(rd)
        warnings.warn("TypedStorage is deprecated", UserWarning)
        logging.getLogger("llm").warning("openai HTTP 503: overloaded; retry 1 of 2 in 0.5 s")   # our own news
    finally:
        log.close()
        restored = list(ray_like.handlers)
        ray_like.removeHandler(own)
    assert restored == before + [own]   # put back as it was
    err = capsys.readouterr().err
    assert "Token authentication" not in err and "TypedStorage" not in err
    assert "retry 1 of 2" in err
    text = (tmp_path / "run" / "logs" / "run.log").read_text()
    assert "Token authentication" in text and "TypedStorage is deprecated" in text


def test_an_interrupted_replay_is_not_advised_to_resume():
    """Ctrl-C during a replay: the advice is to replay again (a replay cannot be resumed), not --resume."""
    from driver import startup
    assert startup.continue_with(cli.Config(), "runs/x") == "continue with: python run.py --resume runs/x"
    advice = startup.continue_with(cli.Config(replay="examples/conv_groupnorm_small"), "runs/x")
    assert "--resume" not in advice and "--replay examples/conv_groupnorm_small again" in advice


def test_the_start_passes_on_the_evaluators_note_about_its_cores(tmp_path):
    """A note from the evaluator's baseline_info (its GPU runners share their cores) is printed once,
    after the reference's line."""
    import tasks
    from driver import rundir, startup

    class Ev:
        def baseline_ms(self):
            return 1.5

        def baseline_info(self):
            return {"self_check": 1.01, "cores_note": "this process may use 1 core(s), too few"}
    said: list[str] = []
    ev, ms = startup.measure_reference(Ev, rundir.RunDir(tmp_path / "run"), tasks.get("conv_groupnorm_small"),
                                       cli.Config(), "cpu", said.append)
    assert ms == 1.5 and isinstance(ev, Ev)
    assert said[-2].startswith("reference: 1.5 ms per call; timed as a candidate it reads 1.010x")
    assert said[-1] == "note: this process may use 1 core(s), too few"

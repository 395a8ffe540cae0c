"""run.py from the command line, interrupted and resumed, and stopped by a failing LLM: real processes, real
local HTTP servers, real run directories, the real evaluator (only the reference is measured: the scripted
LLM's candidates are all rejected by the evaluator's static screen, so rounds take well under a second)."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import tasks
from fake_llm import RuleBasedLLM
from http_fixtures import ScriptedServer

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow

# Rejected at once by the screen (no build, no run): the search loop turns without measuring candidates.
REJECTED = ("import torch\nimport torch.nn as nn\n\nclass ModelNew(nn.Module):\n    def __init__(self, *args):\n"
            "        super().__init__()\n\n    def forward(self, x):\n        return x * eval('1')\n")
OK_REPLY = {"id": "x", "object": "chat.completion", "model": "m",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "OK"}}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}}


@contextlib.contextmanager
def _llm_server(delay_s: float = 0.0):
    """A local OpenAI-compatible server answering every HCM prompt; yields (base URL, request counter)."""
    llm = RuleBasedLLM([REJECTED], seed=1, variants=True)
    calls = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            calls.append(body["model"])
            time.sleep(delay_s)
            text = llm("\n".join(m["content"] for m in body["messages"]))
            data = json.dumps({"id": "c", "object": "chat.completion", "model": body["model"],
                               "choices": [{"index": 0, "finish_reason": "stop",
                                            "message": {"role": "assistant", "content": text}}],
                               "usage": {"prompt_tokens": 100, "completion_tokens": 10}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/v1", calls
    finally:
        httpd.shutdown()


def _env():
    env = {k: v for k, v in os.environ.items()
           if not any(s in k for s in ("API_KEY", "BASE_URL", "PACEVOLVE_MODEL"))}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _start(args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(ROOT / "run.py"), *map(str, args)], cwd=ROOT, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _interrupt_when(proc: subprocess.Popen, ready, timeout: float = 300, sig=signal.SIGINT) -> tuple[str, str]:
    """SIGINT (Ctrl-C), or `sig`, as soon as `ready()` holds; returns stdout and stderr after the process
    ended."""
    deadline = time.time() + timeout
    while not ready():
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, "timed out waiting"
        time.sleep(0.02)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == (143 if sig == signal.SIGTERM else 130), out + err
    assert "Traceback" not in err and "continue with: python run.py --resume" in err, err
    assert ("terminated (SIGTERM)" if sig == signal.SIGTERM else "interrupted (Ctrl-C)") in err, err
    return out, err


def _round(out: Path) -> int | None:
    try:
        return json.loads((out / "checkpoint.json").read_text())["round"]
    except (OSError, ValueError, KeyError):
        return None


def test_ctrl_c_in_setup_round_0_and_mid_run_all_resume(tmp_path):
    # A problem file that imports a module beside it: every evaluator worker must find it.
    (tmp_path / "problem").mkdir()
    (tmp_path / "problem" / "gn_helper.py").write_text("GROUPS = 8\n")
    problem = tmp_path / "problem" / "my_conv.py"
    problem.write_text("import gn_helper  # noqa: F401\n" + tasks.get("conv_groupnorm_small").reference_src)
    out = tmp_path / "run"
    with _llm_server(delay_s=0.1) as (url, calls), _llm_server() as (new_url, new_calls):
        args = ["--task", problem, "--device", "cpu", "--islands", "2", "--generations", "3", "--base-url", url,
                "--model", "fake", "--out", out, "--eval-cache", tmp_path / "cache"]
        # 1. during set-up: the run directory exists, the reference is being measured
        _interrupt_when(_start(args), lambda: (out / "config.json").exists())
        assert _round(out) is None
        # 2. right after the round-0 checkpoint, while round 1 is in flight
        _interrupt_when(_start(["--resume", out]), lambda: _round(out) == 0)
        # 3. mid-run: a round in flight after at least one finished; SIGTERM (a scheduler, `timeout`) ends
        # the run as Ctrl-C does, with its own word and exit code (143)
        proc = _start(["--resume", out])
        _interrupt_when(proc, lambda: (_round(out) or 0) >= 1 and time.sleep(0.15) is None, sig=signal.SIGTERM)
        assert "stopped: terminated (SIGTERM)" in (out / "report.md").read_text()
        interrupted_at = _round(out)
        assert 1 <= interrupted_at < 3
        # 4. the problem file was edited meanwhile; the run goes on against its own copy, on a new server
        problem.write_text(problem.read_text() + "\n# edited after the run started\n")
        done = subprocess.run([sys.executable, str(ROOT / "run.py"), "--resume", str(out),
                               "--base-url", new_url], cwd=ROOT, env=_env(), capture_output=True, text=True,
                              timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "has changed since the run started" in done.stderr and "reference.py" in done.stderr
    assert f"resuming {out} at round {interrupted_at}" in done.stdout
    assert new_calls and len(calls) > 0   # the resumed run asked the new server
    assert _round(out) == 3
    config = json.loads((out / "config.json").read_text())
    assert config["config"]["base_url"] == new_url
    assert config["resumes"][-1]["changes"] == {"base_url": {"from": url, "to": new_url}}
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    generations = [(e["island"], e["generation"]) for e in events if e["type"] == "generation"]
    assert sorted(generations) == [(i, g) for i in (0, 1) for g in (1, 2, 3)]   # each exactly once
    assert [e["round"] for e in events if e["type"] == "resume"][-1] == interrupted_at
    logs = list((out / "logs").glob("*.log"))   # worker logs live in the run directory, none of them empty
    assert all(p.stat().st_size > 0 for p in logs), [p.name for p in logs]
    state = json.loads((out / "checkpoint.json").read_text())
    assert state["wall_s"] > 0
    text = (out / "report.md").read_text()
    for part in ("wall time", "LLM failures: none", "evaluations: rejected", "tokens per island: island 0",
                 "![every evaluation and the best so far per island](progress.png)"):
        assert part in text, text
    assert (out / "progress.png").exists()


def test_consecutive_llm_failures_stop_the_run_with_checkpoint_and_report(tmp_path):
    server = ScriptedServer()
    server.add(200, OK_REPLY)                    # the probe passes ...
    for _ in range(12):                          # ... then the key is revoked
        server.add(401, {"error": {"message": "Incorrect API key provided"}})
    out = tmp_path / "run"
    try:
        proc = subprocess.run([sys.executable, str(ROOT / "run.py"), "--task", "conv_groupnorm_small",
                               "--islands", "2", "--generations", "20", "--base-url", server.url + "/v1",
                               "--model", "fake", "--max-llm-failures", "3", "--out", str(out)],
                              cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    finally:
        server.close()
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "3 LLM calls in a row failed" in proc.stdout and "AuthError" in proc.stdout
    assert "llm_error (AuthError)" in proc.stdout   # the progress line names the class
    assert "--resume" in proc.stderr and "Traceback" not in proc.stderr
    assert _round(out) == 2 and len(server.requests) <= 5
    text = (out / "report.md").read_text()
    assert "stopped: 3 LLM calls in a row failed" in text and "LLM failures: AuthError" in text
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    assert not [e for e in events if e["type"] == "action"]   # no intervention without an LLM
    failed = [e["time"] for e in events if e["type"] == "generation"]
    assert len(failed) == 4 and failed[-1] - failed[0] < 30   # stopped within seconds of the failures

"""Vendoring: each unit of the README's vendoring table, copied alone into an empty directory, is imported
and used there with `python -I` (no PYTHONPATH, no user site, no current directory), so nothing reaches
back into the repository. The units and their files are read from the README's table, so the README and
this test name the same units; the evaluator also evaluates a tiny CPU candidate from its copy.

    python -m pytest tests/test_vendoring.py
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
REFERENCE = (REPO / "tests" / "candidates_cpu" / "reference_small.py").read_text()
CANDIDATE = (REPO / "tests" / "candidates_cpu" / "honest_torch.py").read_text()

# A first use of each unit from its copy, beyond the import (the LLM client answers a call from a local HTTP
# server, HCM runs a whole generation on a scripted LLM); each prints "ok" at the end.
USE = {
    "momentum": "import momentum, random\n"
                "m = momentum.Momentum(10.0, 0.0, threshold=0.5)\n"
                "assert m.update(8.0) > 0 and m.update(None) == 0\n"
                "assert momentum.Momentum.from_dict(m.to_dict()) == m\n"
                "assert 0 <= momentum.power_law_index(5, 1.5, random.Random(0)) < 5\n",
    "crossover": "import crossover, random\n"
                 "w = crossover.action_weights(0.2, {1: 0.6})\n"
                 "assert w[1] > 0 and crossover.choose_action(0.2, {1: 0.6}, random.Random(0)) in w\n",
    "LLM client": "import http.server, json, llm, threading\n"
                  "class Reply(http.server.BaseHTTPRequestHandler):\n"
                  "    def do_POST(self):\n"
                  "        self.rfile.read(int(self.headers['Content-Length']))\n"
                  "        body = json.dumps({'choices': [{'message': {'content': 'pong'}, 'finish_reason': 'stop'}],\n"
                  "                           'usage': {'prompt_tokens': 3, 'completion_tokens': 1}}).encode()\n"
                  "        self.send_response(200); self.send_header('Content-Type', 'application/json')\n"
                  "        self.send_header('Content-Length', str(len(body))); self.end_headers(); self.wfile.write(body)\n"
                  "    def log_message(self, *args): pass\n"
                  "server = http.server.HTTPServer(('127.0.0.1', 0), Reply)\n"
                  "threading.Thread(target=server.serve_forever, daemon=True).start()\n"
                  "url = f'http://127.0.0.1:{server.server_port}/v1'\n"
                  "client = llm.Client('openai', 'some-model', base_url=url, api_key='x')\n"
                  "assert client('ping') == 'pong' and client.usage['prompt_tokens'] == 3, client.usage\n",
    "HCM": "import hcm\n"
           "replies = iter(['**Idea 1**\\nIdea: Fuse the tail.\\nReasoning: one pass.\\n\\nChoice: proposal 1\\n'\n"
           "                'Experiment: one block per row\\n',\n"
           "                '```python\\nimport torch\\nclass ModelNew(torch.nn.Module):\\n    pass\\n```\\n'])\n"
           "pool, log, seen = hcm.IdeaPool(), hcm.GlobalLog(), []\n"
           "task = hcm.TaskContext(name='t', background='a CPU', reference='class Model: pass')\n"
           "r = hcm.run_generation(pool, log, task=task, parent=hcm.Parent(source='class Model: pass'),\n"
           "                       llm=lambda prompt: next(replies),\n"
           "                       execute=lambda src: seen.append(src) or hcm.Outcome('ok', 1.5, '1.5 ms'))\n"
           "assert r.status == 'evaluated' and r.llm_calls == 2 and len(seen) == 1, r\n"
           "assert pool.ideas[0].hypotheses[0].experiment == 'one block per row'\n"
           "assert hcm.IdeaPool.from_dict(pool.to_dict()).to_dict() == pool.to_dict()\n",
    "evaluator": "from evaluate_kernel import Evaluator, evaluate, EvalResult, STATUSES\n"
                 "assert 'ok' in STATUSES\n",
}


def vendoring_table() -> dict[str, list[str]]:
    """The README's vendoring table: unit -> the files and folders to copy (its `copy` column)."""
    text = (REPO / "README.md").read_text()
    section = text.split("\n## Vendoring", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1:-1] for line in section.splitlines() if line.startswith("|")]
    return {cells[0].strip(): re.findall(r"`([^`]+)`", cells[1]) for cells in rows[2:]}


def _run(tmp_path: Path, code: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(tmp_path)!r})\n" + code],
                          cwd=str(tmp_path), capture_output=True, text=True, timeout=timeout)


def _copy(paths: list[str], to: Path) -> None:
    for name in paths:
        source = REPO / name.rstrip("/")
        if source.is_dir():
            shutil.copytree(source, to / source.name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(source, to / source.name)


def test_the_readme_table_names_the_units_tested_here():
    table = vendoring_table()
    assert set(table) == set(USE), table
    assert all(table.values()) and all((REPO / p.rstrip("/")).exists() for ps in table.values() for p in ps)


@pytest.mark.parametrize("unit", sorted(USE))
def test_each_unit_copied_alone_imports_and_runs(tmp_path, unit):
    _copy(vendoring_table()[unit], tmp_path)
    done = _run(tmp_path, USE[unit] + "print('ok')", timeout=120)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


def test_the_evaluator_folder_alone_evaluates_a_cpu_candidate(tmp_path):
    _copy(vendoring_table()["evaluator"], tmp_path)
    (tmp_path / "ref.py").write_text(REFERENCE)
    (tmp_path / "cand.py").write_text(CANDIDATE)
    code = ("from evaluate_kernel import Evaluator, evaluate, EvalResult\n"
            "r = evaluate(open('ref.py').read(), open('cand.py').read(), device='cpu', cache_dir='cache',\n"
            "             max_pairs=6, timing_s=3.0)\n"
            "assert isinstance(r, EvalResult)\n"
            "import evaluate_kernel, os\n"
            "print(r.status, r.speedup, os.path.dirname(evaluate_kernel.__file__))\n")
    done = _run(tmp_path, code)
    assert done.returncode == 0, done.stderr[-3000:]
    status, speedup, where = done.stdout.split()[-3:]
    assert status == "ok" and float(speedup) > 0, done.stdout
    assert Path(where) == tmp_path / "evaluate_kernel"

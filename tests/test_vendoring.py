"""Each unit the README's vendoring table names can be copied alone into an empty directory and used there
with `python -I` (no PYTHONPATH, no user site, no current directory): nothing reaches back into the repo."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
REFERENCE = (REPO / "tests" / "candidates_cpu" / "reference_small.py").read_text()
CANDIDATE = (REPO / "tests" / "candidates_cpu" / "honest_torch.py").read_text()


def _run(tmp_path: Path, code: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(tmp_path)!r})\n" + code],
                          cwd=str(tmp_path), capture_output=True, text=True, timeout=timeout)


def test_the_evaluator_folder_alone_evaluates_a_cpu_candidate(tmp_path):
    shutil.copytree(REPO / "evaluate_kernel", tmp_path / "evaluate_kernel",
                    ignore=shutil.ignore_patterns("__pycache__"))
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


@pytest.mark.parametrize("module", ["momentum.py", "crossover.py", "driver/models.py"])
def test_the_pure_modules_stand_alone(tmp_path, module):
    shutil.copy(REPO / module, tmp_path / Path(module).name)
    done = _run(tmp_path, f"import {Path(module).stem}\nprint('ok')")
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]

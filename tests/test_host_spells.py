"""scripts/host_spells.py: whether the host's slow spells are one core's or the machine's (pure report,
and a short run on this machine's cores)."""
from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import host_spells  # noqa: E402

FAST, SLOW = 80e-6, 140e-6


def _row(text: str, key: str) -> list[str]:
    line = next(l for l in text.splitlines() if l.startswith(f"| {key} |"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_spells_shared_by_two_cores_agree_and_a_third_cores_do_not():
    spells = [FAST] * 10 + [SLOW] * 10
    text = host_spells.report({0: spells, 1: spells + [None], 2: [FAST, SLOW] * 10}, 0.01)
    assert _row(text, "0")[1:] == ["80.0", "0.500", "20"]
    assert _row(text, "0, 1")[1] == "1.000"          # the machine's: slow together every time
    assert _row(text, "0, 2")[1] == "0.333"          # 5 both slow of 15 either slow
    assert _row(text, "0, 2")[2] == "0.333"          # what independent cores give at these shares


def test_a_short_run_on_this_machine():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "host_spells.py"), "--seconds", "0.3",
                          "--period-ms", "20"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    cores = sorted(os.sched_getaffinity(0))
    assert all(f"| {c} |" in out.stdout for c in cores), out.stdout

"""Record the example run shipped in examples/ for `python run.py --replay` (no API key, no network).

The README's first command replays it.

    python scripts/record_example.py [--out examples/conv_groupnorm_small] [--seed 1]   # --out: from the repository root

A real CPU search of conv_groupnorm_small with the real evaluator, whose model is the rule-based scripted LLM
of tests/fake_llm.py served over HTTP on 127.0.0.1, as a local OpenAI-compatible server would be: the
transcript is written by the real client. Its replies pick among tests/test_run.py's candidate programs
(honest, honest but slow, wrong), so the run shows ideas, repairs of a wrong program, a prune and
interventions. Then what a replay does not need is removed (worker logs, the previous checkpoint, the
report page, which `--report` or the replay draws again). Re-record after a change to the prompts: the
shipped example replays only while the prompts are the ones it recorded (tests/test_replay.py checks).
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from fake_llm import OpenAIServer, RuleBasedLLM  # noqa: E402
from test_run import HEADER, INIT, SLOW, WRONG, HONEST  # noqa: E402

# Faster than the reference on a CPU: the same operators, called directly, in place where they can be.
FAST = HEADER + INIT + '''
    def forward(self, x):
        c = F.conv2d(x, self.conv.weight, self.conv.bias)
        t = F.group_norm(c, self.group_norm.num_groups, self.group_norm.weight, self.group_norm.bias,
                         self.group_norm.eps)
        t.tanh_()
        F.hardswish(t, inplace=True)
        return torch.logsumexp(t.add_(c), dim=1, keepdim=True)
'''
PROGRAMS = [FAST, HONEST, SLOW, WRONG]
OPTIONS = ["--task", "conv_groupnorm_small", "--islands", "2", "--generations", "5", "--freeze", "2",
           "--eps-rel", "0.95", "--k-idea", "4", "--model", "scripted-llm"]
SEED = 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("examples/conv_groupnorm_small"))
    p.add_argument("--seed", type=int, default=SEED, help="the search's and the scripted LLM's seed")
    args = p.parse_args()
    if args.out.is_absolute():
        raise SystemExit("record_example.py: give --out relative to the repository root (config.json keeps it)")
    if (ROOT / args.out).exists():
        shutil.rmtree(ROOT / args.out)
    with OpenAIServer(RuleBasedLLM(PROGRAMS, seed=args.seed, variants=True, stable=True)) as server:
        proc = subprocess.run([sys.executable, str(ROOT / "run.py"), *OPTIONS, "--seed", str(args.seed),
                               "--base-url", server.url, "--out", str(args.out)], cwd=ROOT)
    if proc.returncode != 0:
        return proc.returncode
    out = ROOT / args.out
    for name in ("logs", "checkpoint.prev.json", "report.html"):
        path = out / name
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"{args.out}: {size / 1024:.0f} KB, transcript {(out / 'transcript.jsonl').stat().st_size / 1024:.0f} KB")
    return 0


if __name__ == "__main__":
    sys.exit(main())

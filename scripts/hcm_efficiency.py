"""LLM calls and prompt characters per evaluated candidate of a scripted search (no GPU, no LLM, about a minute).

Backs BENCHMARKS.md, "HCM: LLM calls and prompt characters per evaluated candidate", and docs/hcm.md.

Runs run.Search in-process: two islands of conv_groupnorm_small, the rule-based fake LLM (tests/fake_llm.py)
as both the main and the secondary model (two instances, so they are counted apart), and an instant fake
evaluator whose runtime depends on a tag in the program. The candidate programs are the 9.5 KB hand-fused
CUDA kernel from tests/kernels/ with a tag added, so prompts carry code of the size real runs produce.
Settings make every mechanism fire: K_idea 4, K_hyp 2, freeze 2, eps_rel 0.9, one program in four fails
(repairs). The workload is shaped like a real model's: a share of replies (--slips, 5%) ignore the answer
format, as real models sometimes do (each costs a format reminder), and the evaluator's figures carry
noise (--noise, 10%: each measurement off by up to that much, 95%, and it says so), so the confirmed
ranking fights its head-to-heads; their re-measurements are counted apart from LLM calls.

    python3 scripts/hcm_efficiency.py                        # this checkout, seeds 0-9
    python3 scripts/hcm_efficiency.py --repo /tmp/pristine   # another checkout's hcm.py/run.py/fake_llm.py

Prints totals over the seeds, per model: calls, prompt characters, calls and characters per evaluated
candidate, calls per kind;
the mechanisms that fired; and how many prompts carry the same fenced code block twice.
"""
from __future__ import annotations

import argparse
import collections
import hashlib
import json
import math
import re
import sys
import tempfile
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repo", default=str(HERE), help="checkout whose hcm.py, run.py and tests/fake_llm.py run")
    ap.add_argument("--generations", type=int, default=12)
    ap.add_argument("--seeds", default="0,1,2,3,4,5,6,7,8,9",
                    help="comma-separated seeds; figures are totals over them")
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("--slips", type=float, default=0.05, help="share of replies that ignore the answer format")
    ap.add_argument("--noise", type=float, default=0.10, help="the evaluator's relative noise (95%% half-width)")
    args = ap.parse_args()
    sys.path[:0] = [args.repo, str(Path(args.repo) / "tests")]
    figures = measure(args.generations, [int(x) for x in args.seeds.split(",")], args.slips, args.noise)
    print(report(figures))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))


def measure(generations: int, seeds: list[int], slips: float = 0.0, noise: float | None = None) -> dict:
    """Returns the figures of one scripted search per seed, added up."""
    runs = [measure_one(generations, seed, slips, noise) for seed in seeds]
    out = {"generations": generations, "islands": 2, "seeds": seeds, "slips": slips, "noise": noise,
           "evaluated": sum(r["evaluated"] for r in runs), "models": {},
           "remeasured": sum(r["remeasured"] for r in runs),
           "unusable": dict(sum((collections.Counter(r["unusable"]) for r in runs), collections.Counter()))}
    for name in ("main", "secondary"):
        calls = sum(r["models"][name]["calls"] for r in runs)
        chars = sum(r["models"][name]["prompt_chars"] for r in runs)
        kinds = collections.Counter()
        for r in runs:
            kinds.update(r["models"][name]["kinds"])
        out["models"][name] = {"calls": calls, "prompt_chars": chars, "calls_per_eval": calls / out["evaluated"],
                               "chars_per_eval": chars / out["evaluated"],
                               "max_prompt_chars": max(r["models"][name]["max_prompt_chars"] for r in runs),
                               "kinds": dict(kinds)}
    out["calls_per_eval"] = sum(m["calls"] for m in out["models"].values()) / out["evaluated"]
    out["mechanisms"] = dict(sum((collections.Counter(r["mechanisms"]) for r in runs), collections.Counter()))
    out["mechanisms"] = {k: out["mechanisms"].get(k, 0) for k in runs[0]["mechanisms"]}
    out["prompts_with_repeated_code"] = sum(r["prompts_with_repeated_code"] for r in runs)
    return out


def measure_one(generations: int, seed: int, slips: float = 0.0, noise: float | None = None) -> dict:
    import random

    import hcm
    import run
    import tasks
    from fake_llm import RuleBasedLLM

    body = (HERE / "tests" / "kernels" / "conv_groupnorm_fused.py").read_text()
    programs = [f"{body}\n\nSPEED = '{tag}'\n" for tag in ("fast", "medium", "slow", "wrong")]
    runtimes = {"'fast'": 2.0, "'medium'": 6.0, "'slow'": 12.0}

    class Result:
        def __init__(self, status, runtime_ms, message=""):
            self.status, self.runtime_ms, self.message = status, runtime_ms, message

        def to_dict(self):
            if self.runtime_ms is None or noise is None:
                return {"status": self.status, "runtime_ms": self.runtime_ms, "message": self.message,
                        "details": {}}
            return {"status": self.status, "runtime_ms": self.runtime_ms, "baseline_ms": 10.0,
                    "speedup": 10.0 / self.runtime_ms, "message": self.message, "details": {"noise": noise}}

    seen: collections.Counter = collections.Counter()   # evaluations per source: the n-th draws its own noise

    class Evaluator:
        opts = types.SimpleNamespace(cpu_threads=1)

        def evaluate(self, src):
            seen[src] += 1   # islands evaluate in threads: draws depend on what is measured, not on the order
            draw = random.Random(f"{seed}|{hashlib.sha256(src.encode()).hexdigest()}|{seen[src]}").gauss
            for tag, ms in runtimes.items():
                if f"SPEED = {tag}" in src:
                    return Result("ok", ms * (math.exp(draw(0, noise / 1.96)) if noise else 1.0))
            return Result("incorrect", None, "incorrect: output 0, trial 2 (inputs x3): worst element "
                                             "[3, 0, 7, 11] = 0.2143 vs reference 0.1187 (tolerance 1.2e-05)")

    class Counting:
        def __init__(self, inner):
            self.inner, self.prompts = inner, []
            self.usage = {"calls": 0, "prompt_tokens": 0, "completion_tokens": 0}

        def __call__(self, prompt):
            self.prompts.append(prompt)
            text = self.inner(prompt)
            digest = hashlib.sha256(f"{seed}|{self.name}|{prompt}".encode()).digest()
            if slips and int.from_bytes(digest[:8], "big") / 2**64 < slips:   # a reply ignoring the answer format
                text = "Let me reconsider the whole approach before committing to an answer."
            self.usage["calls"] += 1
            self.usage["prompt_tokens"] += len(prompt) // 4
            self.usage["completion_tokens"] += len(text) // 4
            return text

    main_llm = Counting(RuleBasedLLM(programs, seed=seed, variants=True))
    cheap_llm = Counting(RuleBasedLLM(programs, seed=seed, variants=True))
    main_llm.name, cheap_llm.name = "main", "secondary"
    # run.Config and run.RunDir, not their homes in driver/: --repo may name a checkout from before driver/
    cfg = run.Config(task="conv_groupnorm_small", islands=2, generations=generations, seed=seed, freeze=2,
                     eps_rel=0.9, k_idea=4, k_hyp=2, quiet=True)
    with tempfile.TemporaryDirectory() as tmp:
        rundir = run.RunDir(Path(tmp) / "run")
        search = run.Search(cfg, tasks.get("conv_groupnorm_small"), Evaluator(), main_llm, cheap_llm,
                            rundir, baseline_ms=10.0, device="cpu")
        search.run()
        events = [json.loads(line) for line in rundir.events_path.read_text().splitlines()]
    evaluated = sum(e["type"] == "evaluation" for e in events)
    out = {"generations": generations, "islands": 2, "seed": seed, "evaluated": evaluated, "models": {},
           "remeasured": sum(e["type"] == "remeasure" for e in events),
           "unusable": dict(getattr(search, "unusable", {}))}
    for name, client in (("main", main_llm), ("secondary", cheap_llm)):
        chars = sum(map(len, client.prompts))
        out["models"][name] = {
            "calls": len(client.prompts), "prompt_chars": chars,
            "calls_per_eval": len(client.prompts) / max(1, evaluated),
            "chars_per_eval": chars / max(1, evaluated),
            "max_prompt_chars": max(map(len, client.prompts), default=0),
            "kinds": dict(collections.Counter(hcm.prompt_kind(p) for p in client.prompts))}
    total = len(main_llm.prompts) + len(cheap_llm.prompts)
    out["calls_per_eval"] = total / max(1, evaluated)
    kinds = collections.Counter(hcm.prompt_kind(p) for p in main_llm.prompts + cheap_llm.prompts)
    statuses = collections.Counter(e.get("status") for e in events if e["type"] == "generation")
    actions = collections.Counter(e["action"] for e in events if e["type"] == "action")
    out["mechanisms"] = {
        "classification": kinds["classification"], "duplicate_check": kinds["duplicate_check"],
        "duplicate_program": statuses["duplicate_program"], "repair": kinds["repair"],
        "summary": kinds["summary"], "prune": kinds["prune"],
        "backtrack": actions["backtrack"], "crossover": actions["crossover"]}
    out["prompts_with_repeated_code"] = sum(_repeats_code(p) for p in main_llm.prompts + cheap_llm.prompts)
    return out


def _repeats_code(prompt: str) -> bool:
    """True when two fenced blocks of the prompt hold the same code (ignoring layout)."""
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", prompt, re.S | re.M)
    keys = [" ".join(b.split()) for b in blocks if b.strip()]
    return len(keys) != len(set(keys))


def report(f: dict) -> str:
    lines = [f"{f['islands']} islands x {f['generations']} generations, seeds {f['seeds']}: "
             f"{f['evaluated']} evaluated candidates, {f['calls_per_eval']:.2f} LLM calls per evaluated candidate"]
    for name, m in f["models"].items():
        lines.append(f"  {name:<9} {m['calls']:4d} calls ({m['calls_per_eval']:.2f}/eval), "
                     f"{m['prompt_chars']:,} prompt chars ({m['chars_per_eval']:,.0f}/eval, "
                     f"largest {m['max_prompt_chars']:,}); "
                     + ", ".join(f"{k} {v}" for k, v in sorted(m['kinds'].items())))
    lines.append("  mechanisms: " + ", ".join(f"{k} {v}" for k, v in f["mechanisms"].items()))
    lines.append(f"  prompts carrying a code block twice: {f['prompts_with_repeated_code']}")
    if "remeasured" in f:
        lines.append(f"  workload: {f['slips']:.0%} of replies off-format, evaluator noise "
                     f"{f['noise'] if f['noise'] is None else format(f['noise'], '.0%')}; unusable replies: "
                     + (", ".join(f"{k} {v}" for k, v in sorted(f["unusable"].items())) or "none")
                     + f"; evaluations re-measured by head-to-heads: {f['remeasured']} "
                     f"({f['remeasured'] / f['evaluated']:.2f} per evaluated candidate)")
    return "\n".join(lines)


if __name__ == "__main__":
    main()

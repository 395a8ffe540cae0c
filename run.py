"""Run PACEvolve on a kernel task: islands, Algorithm 2 wiring, command line, run directory, report.

    python run.py --task conv_groupnorm --islands 2

Each island is one PACEvolve search (paper §3): its own idea pool and log (hcm.py, Algorithm 1), its
programs, its momentum (momentum.py). Islands advance in rounds: within a round every island runs one
generation at the same time (LLM calls and builds overlap; the evaluator serialises GPU timing), then,
in island order, Algorithm 2 runs for each island:

    lines 3-12   score the generation's candidate, update s_best, R_t and m_t      Search._record
    line 13      if the freeze period is over and m_t < eps_rel:                  Search._intervene
    lines 14-25    A_i, {A_j}, weights, action ~ P(a)                             crossover.choose_action
    line 27        Backtrack: restore the pool and programs saved at t' ~ PowerLaw
    line 29        Crossover_j: j's best program becomes the parent, j's ideas join the pool
                 then m <- 1.0 (the paper's reset), and the freeze period starts again

What a backtrack never rolls back: the island's log of tried hypotheses (so nothing that failed is
retried), its best-ever program and score (A_i measures what the island achieved), and the global best.

The score is the candidate's runtime in ms (lower is better); s_0 is the PyTorch reference's runtime
measured at the start on the same device, and the target r defaults to 0 ms (`--target-speedup S` sets
r = s_0 / S, the official configs' per-kernel "target score").

A round is the unit of checkpointing: after every round the whole state (pools, logs, programs,
momentum, snapshots, random generators) is written atomically to checkpoint.json, and every
evaluation is stored the moment it finishes, so `--resume DIR` loses nothing and re-evaluates nothing.
With a deterministic LLM the resumed run is the same as an uninterrupted one.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import datetime
import hashlib
import json
import os
import platform
import random
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import crossover
import hcm
import llm
import momentum
import report_html
import tasks

TOURNAMENT_SIZE = 2   # official default: best of 2 random picks ...
TOURNAMENT_TOP_K = 4  # ... from the island's top 4 programs


# ----------------------------------------------------------------------------- configuration

@dataclass
class Config:
    task: str = "conv_groupnorm"
    islands: int = 2
    generations: int = 50
    model: str | None = None
    provider: str | None = None
    base_url: str | None = None
    secondary_model: str | None = None
    temperature: float | None = None
    max_output_tokens: int | None = None
    device: str | None = None
    gpus: str | None = None
    seed: int = 0
    out: str | None = None
    resume: str | None = None
    eval_cache: str | None = None
    beta: float = momentum.BETA
    eps_rel: float = momentum.THRESHOLD
    freeze: int = 15
    alpha: float = momentum.POWER_ALPHA
    k_idea: int = 5
    k_hyp: int = 20
    proposals: int = 3
    repairs: int = 2
    target_speedup: float | None = None
    token_budget: int | None = None
    allow_tf32: bool = False
    quiet: bool = False
    report: str | None = None


def parse_args(argv: list[str] | None = None) -> Config:
    ns = _parser().parse_args(argv)
    return Config(**{f.name: getattr(ns, f.name) for f in dataclasses.fields(Config)})


def given_options(argv: list[str] | None = None) -> set[str]:
    """The options the user typed (not defaults): a resumed run keeps its saved configuration."""
    return set(vars(_parser(argparse.SUPPRESS).parse_args(argv)))


def _parser(default=None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(argument_default=default,
        prog="run.py", description="PACEvolve: LLM-driven evolutionary search for faster GPU kernels.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)

    def a(*names, **kw):
        if default is argparse.SUPPRESS:
            kw["default"] = argparse.SUPPRESS   # only what was typed shows up
        p.add_argument(*names, **kw)

    a("--task", default=Config.task,
      help=f"built-in task name ({', '.join(tasks.names())}) or a KernelBench problem file path")
    a("--islands", type=int, default=Config.islands, help="number of islands searching concurrently")
    a("--generations", type=int, default=Config.generations, help="generations per island")
    a("--model", help="main LLM (idea generation, selection and code), e.g. gemini-2.5-pro, gpt-5, "
                      "claude-sonnet-4-5, or any model a local OpenAI-compatible server serves")
    a("--provider", choices=["openai", "gemini", "anthropic"],
      help="API family; guessed from the model name or --base-url when omitted")
    a("--base-url", help="OpenAI-compatible server, e.g. http://localhost:8000/v1 (vLLM), "
                         "http://localhost:11434/v1 (Ollama)")
    a("--secondary-model", help="cheaper LLM for classification, summaries and pruning "
                                "(the paper used Gemini 2.5 Flash); same provider settings")
    a("--temperature", type=float, help="sampling temperature (provider default when omitted)")
    a("--max-output-tokens", type=int, help="output token limit per LLM call")
    a("--device", choices=["cuda", "cpu"], help="where candidates run (default: the task's own)")
    a("--gpus", help="comma-separated GPU indices for evaluation, e.g. 0,1 (default: all visible)")
    a("--seed", type=int, default=Config.seed, help="seed for every random choice of the search")
    a("--out", help="run directory (default: runs/<task>-<time>)")
    a("--resume", metavar="DIR", help="continue the run in DIR from its last checkpoint")
    a("--eval-cache", metavar="DIR", help="shared store of evaluations keyed by task, device and "
                                          "source, so runs re-use each other's measurements")
    a("--beta", type=float, default=Config.beta, help="momentum decay beta (§3.2)")
    a("--eps-rel", type=float, default=Config.eps_rel, help="stagnation threshold eps_rel (§3.2)")
    a("--freeze", type=int, default=Config.freeze,
      help="generations after the start or an intervention before the next one may fire")
    a("--alpha", type=float, default=Config.alpha, help="power-law exponent of backtracking")
    a("--k-idea", type=int, default=Config.k_idea, help="idea cap K_idea (Algorithm 1)")
    a("--k-hyp", type=int, default=Config.k_hyp, help="hypotheses per idea before summary, K_hyp")
    a("--proposals", type=int, default=Config.proposals, help="ideas proposed per generation")
    a("--repairs", type=int, default=Config.repairs,
      help="LLM repairs of a failing candidate within one generation")
    a("--target-speedup", type=float,
      help="speedup at which the gap counts as closed: r = s_0 / S (default r = 0 ms)")
    a("--token-budget", type=int, help="stop after this many LLM tokens (prompt + output)")
    a("--allow-tf32", action="store_true",
      help="let the reference and the candidates use TF32 (bounds loosen accordingly)")
    a("--quiet", action="store_true", help="no per-generation progress lines")
    a("--report", metavar="DIR", help="write DIR/report.html for any run directory (finished, running "
                                      "or killed) and exit")
    return p


# ----------------------------------------------------------------------------- islands

@dataclass
class Program:
    id: str
    score: float          # runtime in ms


@dataclass
class Island:
    """One island's state; everything in it round-trips through JSON for checkpoints."""
    index: int
    momentum: momentum.Momentum
    rng: random.Random
    pool: hcm.IdeaPool = field(default_factory=hcm.IdeaPool)
    log: hcm.GlobalLog = field(default_factory=hcm.GlobalLog)
    elites: list[Program] = field(default_factory=list)    # the island's best programs, best first
    forced_parent: str | None = None                       # set by a crossover for the next generation
    best: Program | None = None                            # best ever: never rolled back
    snapshots: list[dict] = field(default_factory=list)    # restore points, one per generation
    generation: int = 0
    since_action: int = 0
    trajectory: list[list] = field(default_factory=list)   # [generation, island best ms]
    actions: list[dict] = field(default_factory=list)

    def restore_point(self) -> dict:
        return {"pool": self.pool.to_dict(), "elites": [dataclasses.asdict(p) for p in self.elites]}

    def to_dict(self) -> dict:
        return {
            "index": self.index, "momentum": self.momentum.to_dict(),
            "rng": _rng_to_json(self.rng), "pool": self.pool.to_dict(), "log": self.log.to_dict(),
            "elites": [dataclasses.asdict(p) for p in self.elites],
            "forced_parent": self.forced_parent,
            "best": dataclasses.asdict(self.best) if self.best else None,
            "snapshots": self.snapshots, "generation": self.generation,
            "since_action": self.since_action, "trajectory": self.trajectory,
            "actions": self.actions,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Island":
        return cls(
            index=d["index"], momentum=momentum.Momentum.from_dict(d["momentum"]),
            rng=_rng_from_json(d["rng"]), pool=hcm.IdeaPool.from_dict(d["pool"]),
            log=hcm.GlobalLog.from_dict(d["log"]), elites=[Program(**p) for p in d["elites"]],
            forced_parent=d["forced_parent"], best=Program(**d["best"]) if d["best"] else None,
            snapshots=d["snapshots"], generation=d["generation"], since_action=d["since_action"],
            trajectory=d["trajectory"], actions=d["actions"])


def _rng_to_json(rng: random.Random) -> list:
    version, state, gauss = rng.getstate()
    return [version, list(state), gauss]


def _rng_from_json(data: list) -> random.Random:
    rng = random.Random()
    rng.setstate((data[0], tuple(data[1]), data[2]))
    return rng


# ----------------------------------------------------------------------------- run directory

def _count_lines(path: Path) -> int:
    if not path.exists():
        return 0
    with open(path) as f:
        return sum(1 for _ in f)


def write_atomic(path: Path, text: str) -> None:
    """Write via a temporary file and rename, so a crash never leaves half a file behind."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class RunDir:
    """Everything a run writes: config, events, candidates with their evaluations, best.py, report."""

    def __init__(self, path: Path, eval_cache: Path | None = None):
        self.path = path
        self.candidates = path / "candidates"
        self.candidates.mkdir(parents=True, exist_ok=True)
        self.evals = eval_cache or (path / "evals")
        self.evals.mkdir(parents=True, exist_ok=True)
        self.events_path = path / "events.jsonl"
        self.events_written = _count_lines(self.events_path)   # checkpoints record it; resume truncates to it
        self._lock = threading.Lock()

    def event(self, kind: str, **data) -> None:
        line = json.dumps({"type": kind, "time": round(time.time(), 3), **data}, default=str)
        with self._lock, open(self.events_path, "a") as f:
            f.write(line + "\n")
            self.events_written += 1

    def truncate_events(self, n: int) -> None:
        """Drop events written after the checkpoint we resume from; they will happen again."""
        if not self.events_path.exists():
            return
        with open(self.events_path) as f:
            lines = f.readlines()[:n]
        write_atomic(self.events_path, "".join(lines))
        self.events_written = len(lines)

    def save_program(self, src: str) -> str:
        pid = hcm.program_id(src)   # the id HCM records on the hypothesis, so records lead to the file
        path = self.candidates / f"{pid}.py"
        if not path.exists():
            write_atomic(path, src)
        return pid

    def program(self, pid: str) -> str:
        return (self.candidates / f"{pid}.py").read_text()

    def eval_key(self, context: str, src: str) -> str:
        return hashlib.sha256((context + "\0" + src).encode()).hexdigest()[:24]

    def load_eval(self, key: str) -> dict | None:
        path = self.evals / f"{key}.json"
        return json.loads(path.read_text()) if path.exists() else None

    def store_eval(self, key: str, result: dict) -> None:
        write_atomic(self.evals / f"{key}.json", json.dumps(result, indent=1))


# ----------------------------------------------------------------------------- the search

class Search:
    """Islands running HCM generations with Algorithm 2 between them."""

    def __init__(self, cfg: Config, task: tasks.Task, evaluator, llm_main, llm_cheap, rundir: RunDir,
                 baseline_ms: float, device: str, out=print):
        self.cfg, self.task, self.evaluator, self.rundir = cfg, task, evaluator, rundir
        self.llm_main, self.llm_cheap = llm_main, llm_cheap
        self.s0 = baseline_ms
        self.target = baseline_ms / cfg.target_speedup if cfg.target_speedup else 0.0
        self.device = device
        self.out = out
        self.round = 0
        self.islands = [self._new_island(i) for i in range(cfg.islands)]
        self.global_best: dict | None = None
        self.eval_seconds = 0.0
        self.eval_counts: dict[str, int] = {}
        self._eval_lock = threading.Lock()
        self._inflight: dict[str, threading.Event] = {}
        self.hcm_config = hcm.HCMConfig(n_proposals=cfg.proposals, k_idea=cfg.k_idea,
                                        k_hyp=cfg.k_hyp, max_repairs=cfg.repairs)
        background = hcm.kernel_background(task_description=task.description,
                                           hardware=_hardware_name(device),
                                           reference_src=task.reference_src)
        # Each island names itself in its prompts: islands start from the same empty state, and with a
        # deterministic LLM (temperature 0, a local server) identical prompts would make them clones.
        self.contexts = [hcm.TaskContext(name=f"{task.name} (search island {i + 1} of {cfg.islands})",
                                         background=background) for i in range(cfg.islands)]
        self.eval_context = "\0".join([task.reference_src, device, str(cfg.allow_tf32)])

    def _new_island(self, i: int) -> Island:
        island = Island(index=i, rng=random.Random(f"{self.cfg.seed}:{i}"),
                        momentum=momentum.Momentum(self.s0, self.target, beta=self.cfg.beta,
                                                   threshold=self.cfg.eps_rel))
        island.snapshots.append(island.restore_point())   # restore point 0: the empty start
        return island

    # -- one generation of one island (runs in a worker thread) --------------------------------

    def _parent(self, island: Island) -> hcm.Parent:
        """Tournament selection among the island's best programs; the reference when it has none."""
        pid = island.forced_parent
        if pid is None and island.elites:
            top = island.elites[:TOURNAMENT_TOP_K]
            picks = island.rng.sample(top, min(TOURNAMENT_SIZE, len(top)))
            pid = min(picks, key=lambda p: p.score).id
        if pid is None:
            return hcm.Parent(source=self.task.reference_src, metric=(
                f"this is the PyTorch reference itself (class Model): {self.s0:.4g} ms. "
                f"Your program must define ModelNew."), program_id=None)
        score = self._score_of(pid)
        return hcm.Parent(source=self.rundir.program(pid), program_id=pid,
                          metric=self._metric_text(score))

    def _score_of(self, pid: str) -> float:
        for island in self.islands:
            for p in island.elites + ([island.best] if island.best else []):
                if p.id == pid:
                    return p.score
        raise KeyError(pid)

    def _metric_text(self, ms: float) -> str:
        return f"{ms:.4g} ms, {self.s0 / ms:.3f}x the speed of the PyTorch reference ({self.s0:.4g} ms)"

    def _execute(self, src: str) -> hcm.Outcome:
        """The evaluation callback HCM calls: cached by source, stored the moment it finishes."""
        pid = self.rundir.save_program(src)
        key = self.rundir.eval_key(self.eval_context, src)
        while True:
            with self._eval_lock:
                cached = self.rundir.load_eval(key)
                if cached is not None:
                    break
                waiter = self._inflight.get(key)
                if waiter is None:
                    self._inflight[key] = threading.Event()
                    break
            waiter.wait()   # another island is evaluating the same source right now
        if cached is None:
            try:
                result = self.evaluator.evaluate(src).to_dict()
                result["program_id"] = pid
                self.rundir.store_eval(key, result)   # stored before any waiter wakes up
            finally:
                with self._eval_lock:
                    self._inflight.pop(key).set()
            d = result.get("details") or {}
            with self._eval_lock:
                self.eval_seconds += float(d.get("check_s") or 0) + float(d.get("time_s") or 0)
                self.eval_counts[result["status"]] = self.eval_counts.get(result["status"], 0) + 1
            self.rundir.event("evaluation", program=pid, status=result["status"],
                              runtime_ms=result.get("runtime_ms"), message=result.get("message", "")[:500])
        else:
            result = cached
            self.rundir.event("evaluation", program=pid, status=result["status"], cached=True,
                              runtime_ms=result.get("runtime_ms"))
        return self._outcome(result)

    def _outcome(self, r: dict) -> hcm.Outcome:
        ok = r["status"] == "ok" and r.get("runtime_ms")
        return hcm.Outcome(status=r["status"], score=r["runtime_ms"] if ok else None,
                           metric=self._metric_text(r["runtime_ms"]) if ok else r["status"],
                           message=r.get("message", ""))

    def _generation(self, island: Island):
        parent = self._parent(island)
        return hcm.run_generation(island.pool, island.log, task=self.contexts[island.index], parent=parent,
                                  llm=self.llm_main, cheap_llm=self.llm_cheap, execute=self._execute,
                                  config=self.hcm_config, rng=island.rng)

    # -- Algorithm 2, applied at the end of each round, in island order -------------------------

    def _record(self, island: Island, gen) -> None:
        island.generation += 1
        island.since_action += 1
        island.forced_parent = None
        outcome = gen.outcome
        score = outcome.score if outcome is not None and outcome.status == "ok" else None
        pid = gen.program_id or None
        if score is not None and pid:
            island.elites = sorted([p for p in island.elites if p.id != pid] + [Program(pid, score)],
                                   key=lambda p: p.score)[:TOURNAMENT_TOP_K]
            if island.best is None or score < island.best.score:
                island.best = Program(pid, score)
            self._update_global_best(island, pid, score)
        r_t = island.momentum.update(score)                     # Algorithm 2 lines 3-12
        island.trajectory.append([island.generation, island.momentum.best])
        island.snapshots.append(island.restore_point())
        self.rundir.event("generation", island=island.index, generation=island.generation,
                          round=self.round, idea=gen.idea_id, experiment=gen.experiment,
                          status=gen.status, outcome=outcome.status if outcome else None,
                          message=(outcome.message[:300] if outcome else ""),
                          runtime_ms=score, program=pid, parent=gen.parent_id,
                          attempts=[a["program_id"] for a in gen.attempts],
                          r_t=r_t, momentum=island.momentum.value,
                          island_best_ms=island.momentum.best, llm_calls=gen.llm_calls,
                          notes=gen.events)
        self._progress(island, gen, score)

    def _intervene(self, island: Island) -> None:
        """Algorithm 2 lines 13-30 for one island."""
        if island.since_action < self.cfg.freeze or not island.momentum.stagnant:
            return
        a_self = island.momentum.absolute                                       # line 14
        a_others = {j.index: j.momentum.absolute for j in self.islands if j is not island}  # 15
        weights = crossover.action_weights(a_self, a_others)                    # lines 16-24
        action = crossover.choose_action(a_self, a_others, island.rng)          # line 25
        record = {"generation": island.generation, "round": self.round, "A_self": a_self,
                  "A_others": a_others, "weights": {str(k): v for k, v in weights.items()}}
        if action != crossover.BACKTRACK and self.islands[action].best is None:
            action = crossover.BACKTRACK   # the partner has no program to give yet
        if action == crossover.BACKTRACK:                                       # line 27
            k = momentum.power_law_index(len(island.snapshots), self.cfg.alpha, island.rng)
            point = island.snapshots[k]
            island.pool = hcm.IdeaPool.from_dict(point["pool"])
            island.elites = [Program(**p) for p in point["elites"]]
            island.snapshots.append(island.restore_point())
            record.update(action="backtrack", restored_index=k, ideas=len(island.pool.ideas))
        else:                                                                   # line 29
            partner = self.islands[action]
            island.forced_parent = partner.best.id
            if all(p.id != partner.best.id for p in island.elites):
                island.elites = sorted(island.elites + [partner.best], key=lambda p: p.score)
            merged = hcm.merge_pools(island.pool, partner.pool)
            notes = hcm.prune_pool(island.pool, island.log, llm=self.llm_cheap or self.llm_main,
                                   config=self.hcm_config, task=self.contexts[island.index])
            record.update(action="crossover", partner=action, parent=partner.best.id,
                          merged_ideas=merged, pruned=notes)
        island.momentum.reset()
        island.since_action = 0
        island.actions.append(record)
        self.rundir.event("action", island=island.index, **record)
        self._say(f"[island {island.index} gen {island.generation}] {record['action']}"
                  + (f" to snapshot {record['restored_index']}" if record["action"] == "backtrack"
                     else f" with island {record['partner']}")
                  + "  weights " + ", ".join(f"{k}={v:.3f}" for k, v in record["weights"].items()))

    def _update_global_best(self, island: Island, pid: str, score: float) -> None:
        if self.global_best is not None and score >= self.global_best["runtime_ms"]:
            return
        self.global_best = {"program": pid, "runtime_ms": score, "speedup": self.s0 / score,
                            "island": island.index, "generation": island.generation,
                            "round": self.round}
        header = (f"# pacevolve best for task {self.task.name}: {score:.4g} ms, "
                  f"{self.s0 / score:.3f}x the PyTorch reference ({self.s0:.4g} ms) on "
                  f"{_hardware_name(self.device)}\n# island {island.index}, generation "
                  f"{island.generation}, program {pid}\n")
        write_atomic(self.rundir.path / "best.py", header + self.rundir.program(pid))

    # -- rounds, checkpoints --------------------------------------------------------------------

    def run(self) -> str:
        """Run rounds until the generation count or token budget is reached; returns why it stopped."""
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=len(self.islands))
        try:
            while self.round < self.cfg.generations:
                if self._over_budget():
                    return "token budget reached"
                gens = list(pool.map(self._generation, self.islands))
                self.round += 1
                for island, gen in zip(self.islands, gens):
                    self._record(island, gen)
                for island in self.islands:
                    self._intervene(island)
                self.checkpoint()
                write_html_report(self.rundir.path)
        finally:
            # on Ctrl-C, do not wait for the round in flight: its evaluations are already stored
            pool.shutdown(wait=False, cancel_futures=True)
        return "all generations done"

    def _over_budget(self) -> bool:
        return bool(self.cfg.token_budget) and self.tokens() >= self.cfg.token_budget

    def tokens(self) -> int:
        total = 0
        for client in {id(c): c for c in (self.llm_main, self.llm_cheap) if c is not None}.values():
            usage = getattr(client, "usage", {}) or {}
            total += int(usage.get("prompt_tokens", 0)) + int(usage.get("completion_tokens", 0))
        return total

    def state(self) -> dict:
        return {"version": 1, "round": self.round, "baseline_ms": self.s0, "target_ms": self.target,
                "islands": [i.to_dict() for i in self.islands], "global_best": self.global_best,
                "eval_seconds": self.eval_seconds, "eval_counts": self.eval_counts,
                "usage": {"main": _usage(self.llm_main), "secondary": _usage(self.llm_cheap)},
                "events": self.rundir.events_written}

    def checkpoint(self) -> None:
        write_atomic(self.rundir.path / "checkpoint.json", json.dumps(self.state()))

    def restore(self, state: dict) -> None:
        self.round = state["round"]
        self.islands = [Island.from_dict(d) for d in state["islands"]]
        self.global_best = state["global_best"]
        self.eval_seconds = state["eval_seconds"]
        self.eval_counts = state["eval_counts"]
        self.rundir.truncate_events(state["events"])
        for client, key in ((self.llm_main, "main"), (self.llm_cheap, "secondary")):
            saved = state["usage"].get(key)
            if client is not None and saved and isinstance(getattr(client, "usage", None), dict):
                for k, v in saved.items():
                    if isinstance(v, (int, float)):
                        client.usage[k] = client.usage.get(k, 0) + v

    # -- output ---------------------------------------------------------------------------------

    def _say(self, line: str) -> None:
        if not self.cfg.quiet:
            self.out(line)

    def _progress(self, island: Island, gen, score: float | None) -> None:
        result = f"{self.s0 / score:.2f}x ({score:.4g} ms)" if score else (
            gen.outcome.status if gen.outcome else gen.status)
        best = island.momentum.best
        glob = self.global_best["speedup"] if self.global_best else 1.0
        self._say(f"[island {island.index} gen {island.generation:>3}] idea {gen.idea_id}: {result:<24}"
                  f" island best {self.s0 / best:.2f}x  global best {glob:.2f}x  "
                  f"m={island.momentum.value:.3f}  tokens {self.tokens():,}")


def _usage(client) -> dict:
    return dict(getattr(client, "usage", {}) or {}) if client is not None else {}


def _hardware_name(device: str) -> str:
    if device == "cuda":
        try:
            import torch
            return torch.cuda.get_device_name(0)
        except Exception:
            return "an NVIDIA GPU"
    return f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"


# ----------------------------------------------------------------------------- report

def write_report(search: Search, why: str, wall_s: float) -> Path:
    cfg, rd = search.cfg, search.rundir
    lines = [f"# pacevolve run: {search.task.name}", "",
             f"- stopped: {why} after {search.round} rounds ({wall_s / 60:.1f} min)",
             f"- device: {_hardware_name(search.device)}",
             f"- reference (s_0): {search.s0:.4g} ms; target r: {search.target:.4g} ms"]
    gb = search.global_best
    if gb:
        lines.append(f"- **best: {gb['runtime_ms']:.4g} ms, {gb['speedup']:.3f}x the reference** "
                     f"(island {gb['island']}, generation {gb['generation']}, `best.py`)")
    else:
        lines.append("- no correct candidate yet")
    usage = search.state()["usage"]
    for name, u in usage.items():
        if u:
            lines.append(f"- LLM {name}: {u.get('calls', 0)} calls, {u.get('prompt_tokens', 0):,} "
                         f"prompt + {u.get('completion_tokens', 0):,} output tokens")
    lines.append(f"- evaluations: " + (", ".join(f"{k} {v}" for k, v in sorted(
        search.eval_counts.items())) or "none") + f"; GPU/CPU seconds checking and timing: "
                 f"{search.eval_seconds:.1f}")
    lines += ["", "## Islands", ""]
    for island in search.islands:
        best = island.best
        lines.append(f"### Island {island.index}: best "
                     + (f"{best.score:.4g} ms ({search.s0 / best.score:.3f}x), program `{best.id}`"
                        if best else "none"))
        lines += ["", "| generation | island best ms | speedup |", "|---:|---:|---:|"]
        step = max(1, len(island.trajectory) // 25)
        for g, ms in island.trajectory[::step] + island.trajectory[-1:] * (step > 1):
            lines.append(f"| {g} | {ms:.4g} | {search.s0 / ms:.3f}x |")
        if island.actions:
            lines += ["", "Interventions (Algorithm 2):", ""]
            for a in island.actions:
                what = (f"backtrack to snapshot {a['restored_index']}" if a["action"] == "backtrack"
                        else f"crossover with island {a['partner']}")
                lines.append(f"- generation {a['generation']}: {what} (A_i={a['A_self']:.3f}, "
                             f"weights " + ", ".join(f"{k}={v:.3f}" for k, v in a["weights"].items())
                             + ")")
        lines.append("")
    if plot_progress(search, rd.path / "progress.png"):
        lines += ["![best so far per island](progress.png)", ""]
    path = rd.path / "report.md"
    write_atomic(path, "\n".join(lines) + "\n")
    return path


def write_html_report(path: Path) -> None:
    """report.html from the run directory's files; a failure to draw it never stops a search."""
    try:
        report_html.write(path)
    except Exception as e:
        print(f"run.py: report.html not written: {type(e).__name__}: {e}", file=sys.stderr)


def plot_progress(search: Search, path: Path) -> bool:
    """Best-so-far speedup per island with interventions marked, when matplotlib is installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:
        return False
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for island in search.islands:
        if not island.trajectory:
            continue
        gens = [g for g, _ in island.trajectory]
        ax.step(gens, [search.s0 / ms for _, ms in island.trajectory], where="post",
                label=f"island {island.index}")
        for a in island.actions:
            marker = "v" if a["action"] == "backtrack" else "*"
            y = search.s0 / island.trajectory[a["generation"] - 1][1]
            ax.plot(a["generation"], y, marker, color="k", markersize=8)
    ax.set_xlabel("generation")
    ax.set_ylabel("best speedup over the reference")
    ax.set_title(f"{search.task.name}: v backtrack, * crossover")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# ----------------------------------------------------------------------------- main

class SetupError(Exception):
    """Something the user must provide before a run can start; the message says what and how."""


def load_task(name: str) -> tasks.Task:
    if name in tasks.names():
        return tasks.get(name)
    if os.path.exists(name):
        return tasks.load(name)
    raise SetupError(f"unknown task {name!r}: use one of {', '.join(tasks.names())} "
                     f"or the path of a KernelBench problem file")


def check_device(device: str) -> None:
    if device != "cuda":
        return
    import torch
    if not torch.cuda.is_available():
        raise SetupError(
            "this task runs on a CUDA GPU, but PyTorch sees none "
            f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'no'}). Run on a machine "
            "with an NVIDIA GPU and a CUDA build of PyTorch, or try the search on the CPU with "
            "`--task conv_groupnorm_small` (a CPU task) or `--device cpu`.")


def make_clients(cfg: Config):
    if not cfg.model and not cfg.base_url:
        cfg.model = os.environ.get("PACEVOLVE_MODEL")
    if not cfg.model:
        raise SetupError(
            "no LLM configured: pass --model (e.g. --model gemini-2.5-pro with GEMINI_API_KEY set, "
            "--model gpt-5 with OPENAI_API_KEY, --model claude-sonnet-4-5 with ANTHROPIC_API_KEY), "
            "or a local OpenAI-compatible server with --base-url http://localhost:8000/v1 --model NAME")
    kw = {}
    if cfg.temperature is not None:
        kw["temperature"] = cfg.temperature
    if cfg.max_output_tokens is not None:
        kw["max_output_tokens"] = cfg.max_output_tokens
    try:
        main = llm.Client.from_env(cfg.model, provider=cfg.provider, base_url=cfg.base_url, **kw)
        cheap = (llm.Client.from_env(cfg.secondary_model, provider=cfg.provider,
                                     base_url=cfg.base_url, **kw) if cfg.secondary_model else None)
    except (llm.LLMError, ValueError) as e:
        raise SetupError(f"cannot set up the LLM client: {e}") from None
    return main, cheap


def make_evaluator(cfg: Config, task: tasks.Task, device: str):
    import evaluate_kernel
    gpus = [int(g) for g in cfg.gpus.split(",")] if cfg.gpus else None
    kw = {"device": device, "allow_tf32": cfg.allow_tf32}
    if device == "cuda":
        kw["gpus"] = gpus
    return evaluate_kernel.Evaluator.for_task(task, **kw)


def versions(device: str) -> dict:
    v = {"python": platform.python_version(), "platform": platform.platform()}
    try:
        import torch
        v.update(torch=torch.__version__, cuda=torch.version.cuda)
        if device == "cuda" and torch.cuda.is_available():
            v["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except Exception:
        pass
    return v


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    try:
        return _main(cfg, given_options(argv))
    except SetupError as e:
        print(f"run.py: {e}", file=sys.stderr)
        return 2


def _main(cfg: Config, given: set[str] = frozenset()) -> int:
    if cfg.report:
        if not Path(cfg.report, "events.jsonl").exists() and not Path(cfg.report, "checkpoint.json").exists():
            raise SetupError(f"--report {cfg.report}: not a run directory (no events.jsonl or checkpoint.json)")
        print(report_html.write(Path(cfg.report)))
        return 0
    resumed = None
    if cfg.resume:
        path = Path(cfg.resume)
        if not (path / "checkpoint.json").exists():
            raise SetupError(f"--resume {path}: no checkpoint.json there")
        saved = json.loads((path / "config.json").read_text())["config"]
        # the search continues as it was configured; only its length, budget and output may change
        keep = {k: v for k, v in dataclasses.asdict(cfg).items()
                if k == "resume" or (k in given and k in ("generations", "quiet", "token_budget"))}
        cfg = Config(**{**saved, **keep, "out": str(path)})
        resumed = json.loads((path / "checkpoint.json").read_text())
    task = load_task(cfg.task)
    device = cfg.device or task.device
    check_device(device)
    llm_main, llm_cheap = make_clients(cfg)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = Path(cfg.out or f"runs/{task.name}-{stamp}")
    path.mkdir(parents=True, exist_ok=True)
    rundir = RunDir(path, Path(cfg.eval_cache) if cfg.eval_cache else None)
    if not resumed:
        write_atomic(path / "config.json", json.dumps(
            {"config": dataclasses.asdict(cfg), "task": task.name, "device": device,
             "hardware": _hardware_name(device), "versions": versions(device),
             "started": stamp}, indent=1))
    evaluator = make_evaluator(cfg, task, device)
    try:
        baseline = resumed["baseline_ms"] if resumed else _baseline(evaluator, rundir, task, cfg, device)
        search = Search(cfg, task, evaluator, llm_main, llm_cheap, rundir, baseline, device)
        if resumed:
            search.restore(resumed)
            search._say(f"resuming {path} at round {search.round}")
        else:
            search._say(f"pacevolve: {task.name} on {_hardware_name(device)}, reference "
                        f"{baseline:.4g} ms, {cfg.islands} islands, run directory {path}")
        t0 = time.time()
        interrupted = False
        try:
            why = search.run()
        except KeyboardInterrupt:
            interrupted = True
            why = "interrupted (Ctrl-C); resume with --resume " + str(path)
        report = write_report(search, why, time.time() - t0)
        write_html_report(path)
        gb = search.global_best
        search._say(f"done: {why}. " + (f"Best {gb['speedup']:.3f}x ({gb['runtime_ms']:.4g} ms) "
                                         f"in {path / 'best.py'}. " if gb else "No correct candidate. ")
                    + f"Report: {report}, {path / 'report.html'}")
    finally:
        evaluator.close()
    if interrupted:
        # worker threads may still sit in an LLM call; everything is on disk, so leave now
        sys.stdout.flush()
        os._exit(130)
    return 0


def _baseline(evaluator, rundir: RunDir, task: tasks.Task, cfg: Config, device: str) -> float:
    """s_0: the reference's runtime on this device, stored with the evaluations for re-use."""
    key = "baseline-" + hashlib.sha256(
        "\0".join([task.reference_src, device, str(cfg.allow_tf32)]).encode()).hexdigest()[:16]
    cached = rundir.load_eval(key)
    if cached:
        return cached["baseline_ms"]
    ms = evaluator.baseline_ms()
    rundir.store_eval(key, {"baseline_ms": ms})
    return ms


if __name__ == "__main__":
    sys.exit(main())

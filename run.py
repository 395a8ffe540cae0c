"""Run PACEvolve on a kernel task: parse, set up, run the islands (Algorithm 2), report.

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

The score is the candidate's runtime in ms (lower is better) at the run's reference conditions: s_0 / the
speedup the evaluator measured against the reference timed beside the candidate. s_0 is the PyTorch
reference's runtime measured at the start on the same device, and the target r defaults to 0 ms
(`--target-speedup S` sets r = s_0 / S, the official configs' per-kernel "target score"). Scores are
confirmed (driver/ranking.py): a candidate becomes an island's best, or the run's, only when it beats the
incumbent by more than the two measurements' noise or wins a head-to-head re-measurement; a re-measured
program's score is the re-measured one wherever it is used (tournament, momentum, crossover, best.py). What
is shown (prompts, console, best.py, report.md) is measured: both times and the speedup with its noise band.

`main` in order: the options are checked (driver/cli.py); driver/startup.py resolves everything once
(new, resumed or replayed run, task, device, LLM clients and their probe calls, run directory, evaluator
and the reference's runtime s_0) into one object; then rounds run until the generations, the token or
dollar budget (models.Role picks a model per call and keeps --budget-usd) or the LLM run out
(`--max-llm-failures` calls in a row failed); report.md and progress.png close it (report/markdown.py),
report.html is drawn after every round (report/html.py).
A round is the unit of checkpointing: the state (pools, logs, programs, momentum, snapshots, random
generators) is written atomically to checkpoint.json at round 0 and after every round, and every
evaluation is stored the moment it finishes (driver/evaluations.py: verdicts only, never one that ended
after a stop was asked for), so `--resume DIR` loses nothing and re-evaluates nothing; with a deterministic
LLM the resumed run is the same as an uninterrupted one. A round cut short (Ctrl-C, SIGTERM, a call the
dollar budget refuses) is not checkpointed and runs again on resume. A score that is not a finite, positive
runtime is never a best and never enters momentum. Every LLM call, probes included, is kept in
transcript.jsonl (driver/transcript.py); `--replay DIR` runs a recorded search again with its replies, no
network (driver/replay.py).
Exit codes: 0 done, 2 a set-up problem (one line says which), 3 stopped by LLM failures, 4 the evaluator
failed, 5 a replay (--replay DIR) left its recording, 130 Ctrl-C (SIGINT), 143 SIGTERM.
"""
from __future__ import annotations

from driver import stopping
if __name__ == "__main__":   # a signal while the modules below load: one line, no traceback
    stopping.quiet_until_installed()

import collections  # noqa: E402
import concurrent.futures
import dataclasses
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import crossover
from driver import cli, console, evaluations, llm_check, models, prompt_background, ranking, replay, startup
from driver import transcript
from driver.cli import Config
from driver.rundir import RunDir, RunDirError, hardware_name
import hcm
import momentum
from report import html as report_html
from report import markdown as report_md
import tasks

TOURNAMENT_SIZE = 2   # official default: best of 2 random picks ...
TOURNAMENT_TOP_K = 4  # ... from the island's top 4 programs
EXIT_LLM_FAILURES = 3
EXIT_EVALUATOR_FAILED = 4
EXIT_REPLAY_MISMATCH = 5
REFERENCE = "reference"   # the program id of the reference: generation 0's program on every island


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
            "rng": models.rng_to_json(self.rng), "pool": self.pool.to_dict(), "log": self.log.to_dict(),
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
            rng=models.rng_from_json(d["rng"]), pool=hcm.IdeaPool.from_dict(d["pool"]),
            log=hcm.GlobalLog.from_dict(d["log"]), elites=[Program(**p) for p in d["elites"]],
            forced_parent=d["forced_parent"], best=Program(**d["best"]) if d["best"] else None,
            snapshots=d["snapshots"], generation=d["generation"], since_action=d["since_action"],
            trajectory=d["trajectory"], actions=d["actions"])


# ----------------------------------------------------------------------------- the search

class Search:
    """Islands running HCM generations with Algorithm 2 between them."""

    def __init__(self, cfg: Config, task: tasks.Task, evaluator, llm_main, llm_cheap, rundir: RunDir,
                 baseline_ms: float, device: str, out=print, facts: dict | None = None,
                 book: transcript.Transcript | None = None, stop: stopping.StopRequest | None = None):
        """`facts`: the device facts of the prompts' background (a replay gives the recorded ones); `book`: the
        transcript, when records were made before the run directory existed (the probes); `stop`: the signals'
        stop request (main installs it); evaluations finishing after it are dropped."""
        self.cfg, self.task, self.rundir = cfg, task, rundir
        self.llm_main, self.llm_cheap = llm_main, llm_cheap
        self.spend = getattr(llm_main, "spend", None)   # models.Spend: dollars and --budget-usd
        self._parent_ms: dict[int, float] = {}          # each island's parent score this round (its gain)
        self.s0 = baseline_ms
        self.target = baseline_ms / cfg.target_speedup if cfg.target_speedup else 0.0
        self.device = device
        self.out = out
        self.round = 0
        self.islands = [self._new_island(i) for i in range(cfg.islands)]
        self.global_best: dict | None = None
        self.ledger = ranking.Ledger(baseline_ms, rounds=cfg.head_to_head)   # confirmed figures, duels
        self.unusable = collections.Counter()        # LLM replies that could not be parsed, by prompt kind
        self.llm_watch = llm_check.FailureWatch(cfg.max_llm_failures)
        self.wall_before, self.started = 0.0, time.time()   # wall time of earlier sessions, this one's start
        self.hcm_config = hcm.HCMConfig(n_proposals=cfg.proposals, k_idea=cfg.k_idea,
                                        k_hyp=cfg.k_hyp, max_repairs=cfg.repairs)
        self.transcript = book if book is not None else transcript.Transcript()
        self.transcript.attach(rundir.path)
        self.facts = facts = facts or prompt_background.device_facts(evaluator, device)
        text = prompt_background.kernel_background(facts, task.description)
        brief = prompt_background.kernel_brief(facts, task.description)
        # Each island names itself in its prompts: islands start from the same empty state, and with a
        # deterministic LLM (temperature 0, a local server) identical prompts would make them clones.
        self.contexts = [hcm.TaskContext(name=f"{task.name} (island {i} of islands 0-{cfg.islands - 1})",
                                         background=text, brief=brief, reference=task.reference_src,
                                         legend=ranking.LEGEND)
                         for i in range(cfg.islands)]
        self.evals = evaluations.Evaluations(evaluator, rundir, evaluations.context(task.reference_src, device, cfg),
                                             baseline_ms, stop or stopping.StopRequest())

    def _new_island(self, i: int) -> Island:
        island = Island(index=i, rng=random.Random(f"{self.cfg.seed}:{i}"),
                        momentum=momentum.Momentum(self.s0, self.target, beta=self.cfg.beta,
                                                   threshold=self.cfg.eps_rel))
        island.elites.append(Program(REFERENCE, self.s0))  # the reference competes as a parent
        island.snapshots.append(island.restore_point())   # restore point 0: the empty start
        return island

    # -- one generation of one island (runs in a worker thread) --------------------------------

    def _parent(self, island: Island) -> hcm.Parent:
        """Tournament selection among the island's best programs, the reference among them, unless a
        crossover forced the parent. The prompt also states the island's best when it is another program."""
        pid, role = island.forced_parent, "parent, taken from another island by crossover"
        if pid is None:
            top = island.elites[:TOURNAMENT_TOP_K] or [Program(REFERENCE, self.s0)]
            picks = island.rng.sample(top, min(TOURNAMENT_SIZE, len(top)))
            pid, role = min(picks, key=lambda p: p.score).id, "parent, chosen by tournament"
        best = min(island.elites + ([island.best] if island.best else []), key=lambda p: p.score,
                   default=Program(REFERENCE, self.s0))
        score = self._score_of(pid)
        other = best.id != pid and best.score < score
        return hcm.Parent(source=self.task.reference_src if pid == REFERENCE else self.rundir.program(pid),
                          metric=self._metric_text(pid), program_id=None if pid == REFERENCE else pid,
                          role=role, is_reference=pid == REFERENCE,
                          best=self._metric_text(best.id) if other else "",
                          best_program_id=best.id if other and best.id != REFERENCE else None)

    def _score_of(self, pid: str) -> float:
        """A program's confirmed score: s_0 / its confirmed speedup (the reference's: s_0)."""
        score = self.s0 if pid == REFERENCE else self.ledger.score(pid)
        for island in self.islands if score is None else []:   # a checkpoint older than the ledger
            for p in island.elites + ([island.best] if island.best else []):
                if p.id == pid:
                    return p.score
        return score

    def _metric_text(self, pid: str) -> str:
        """A program's result as prompts, the console and best.py show it: the times measured and the
        speedup with its noise band (ranking.describe)."""
        if pid == REFERENCE or pid in self.ledger.figures:
            return self.ledger.text(None if pid == REFERENCE else pid)
        return ranking.describe(ranking.Figures(self.s0 / self._score_of(pid)))   # a checkpoint older than the ledger

    def _execute(self, src: str) -> hcm.Outcome:
        """The evaluation callback HCM calls: measured once per source, stored as it finishes
        (driver/evaluations.py)."""
        return self._outcome(*self.evals.candidate(src))

    def _outcome(self, pid: str, r: dict) -> hcm.Outcome:
        """The result HCM records. A program's first measurement becomes its figures; one measured again
        in a head-to-head keeps the re-measured figures, and its score and metric are those."""
        if r["status"] == "ok" and evaluations.score(r, self.s0) is None:
            return hcm.Outcome(status="ok", score=None, metric="ok, not scored",
                               message=f"ok, but the runtime it measured is no finite, positive number "
                                       f"({r.get('runtime_ms')} ms, speedup {r.get('speedup')}); not scored")
        with self.evals.lock:
            fig = self.ledger.note(pid, r)
        if fig is None:
            return hcm.Outcome(status=r["status"], metric=r["status"], message=r.get("message", ""))
        return hcm.Outcome(status="ok", score=self._score_of(pid), metric=self._metric_text(pid),
                           message=f"ok: {self._metric_text(pid)}")

    def _generation(self, island: Island):
        parent = self._parent(island)
        self._parent_ms[island.index] = self._score_of(parent.program_id or REFERENCE)
        g = island.generation + 1
        try:
            return hcm.run_generation(island.pool, island.log, task=self.contexts[island.index], parent=parent,
                                      llm=self._llm(self.llm_main, "main", island, g),
                                      cheap_llm=self._llm(self.llm_cheap, "secondary", island, g),
                                      execute=self._execute, config=self.hcm_config, rng=island.rng)
        except models.BudgetReached as e:   # a call the dollar budget refused: the round is dropped
            return e

    def _llm(self, client, role: str, island: Island, generation: int, stage: str = "generation"):
        """What HCM calls: `client` as this island sees it (a replay answers per island), watched for
        failures in a row and tokens (llm_check), every call kept in the transcript."""
        if client is None:
            return None
        view = client.for_island(island.index) if hasattr(client, "for_island") else client
        return self.transcript.recorder(self.llm_watch.wrap(view, island.index), client, role=role,
                                        island=island.index, generation=generation, stage=stage)

    # -- Algorithm 2, applied at the end of each round, in island order -------------------------

    def _record(self, island: Island, gen) -> None:
        island.generation += 1
        unusable = hcm.count_unusable(gen.events)
        self.unusable.update(unusable)
        island.since_action += 1
        island.forced_parent = None
        outcome = gen.outcome
        score = outcome.score if outcome is not None and outcome.status == "ok" else None
        score = score if evaluations.positive(score) else None   # a NaN or inf is never a best nor momentum
        pid = gen.program_id or None
        crowned, incumbent = False, island.best
        if score is not None and pid:
            island.elites = [p for p in island.elites if p.id != pid] + [Program(pid, score)]
            # the confirmed ranking: the title changes hands only on evidence (driver/ranking.py)
            crowned = island.best is None or self._confirm(island, pid, island.best.id)
            if crowned:
                island.best = Program(pid, score)
                self._update_global_best(island, pid)
        self._rescore()   # a head-to-head re-measures: every copy of a score follows the confirmed figures
        score = self._score_of(pid) if score is not None and pid else None
        if incumbent is not None:   # s_prev: the incumbent's confirmed score (a head-to-head may have moved it)
            island.momentum.best = min(self.s0, self._score_of(incumbent.id))
        r_t = island.momentum.update(island.best.score if crowned else None)   # Algorithm 2 lines 3-12
        parent_ms = self._parent_ms.get(island.index)   # the bandit's reward: the gain on the parent
        gain = max(0.0, 1 - score / parent_ms) if score is not None and parent_ms else 0.0
        cost = self.llm_main.credit(island.index, gain) if hasattr(self.llm_main, "credit") else {}
        island.trajectory.append([island.generation, island.momentum.best])
        island.snapshots.append(island.restore_point())
        self.rundir.event("generation", island=island.index, generation=island.generation,
                          round=self.round, idea=gen.idea_id, experiment=gen.experiment,
                          status=gen.status, outcome=outcome.status if outcome else None,
                          message=(outcome.message[:300] if outcome else ""),
                          runtime_ms=score, program=pid, parent=gen.parent_id, r_t=r_t,
                          momentum=island.momentum.value, island_best_ms=island.momentum.best,
                          island_best=island.best.id if island.best else None, crowned=crowned,
                          llm_calls=gen.llm_calls, calls=gen.calls, unusable=unusable,
                          attempts=[{"program": a["program_id"], "status": a["status"], "score": a.get("score")}
                                    for a in gen.attempts],
                          llm_failures=llm_check.failed_classes(gen.events), notes=gen.events, **cost)
        self._progress(island, gen, score, cost)

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
            next_id = island.pool.next_id     # ids are never reused: the counter is not rolled back
            island.pool = hcm.IdeaPool.from_dict(point["pool"])
            island.pool.next_id = max(next_id, island.pool.next_id)
            island.elites = [Program(**p) for p in point["elites"]]
            island.snapshots.append(island.restore_point())
            record.update(action="backtrack", restored_index=k, ideas=len(island.pool.ideas))
        else:                                                                   # line 29
            partner = self.islands[action]
            given = min([partner.best] + partner.elites, key=lambda p: p.score)   # the partner's best
            island.forced_parent = given.id
            if all(p.id != given.id for p in island.elites):
                island.elites = sorted(island.elites + [given], key=lambda p: p.score)
            merged = hcm.merge_pools(island.pool, partner.pool, src_name=f"island {partner.index}",
                                     dst_name=f"island {island.index}")
            notes = hcm.prune_pool(island.pool, island.log,
                                   llm=self._llm(self.llm_cheap or self.llm_main,
                                                 "secondary" if self.llm_cheap else "main", island,
                                                 island.generation, stage="crossover"),
                                   config=self.hcm_config, task=self.contexts[island.index])
            self.unusable.update(hcm.count_unusable(notes))
            record.update(action="crossover", partner=action, parent=given.id,
                          merged_ideas=merged, pruned=notes)
        self._rescore()   # restored programs carry their confirmed scores, not those of the snapshot
        island.momentum.reset()
        island.since_action = 0
        island.actions.append(record)
        self.rundir.event("action", island=island.index, **record)
        self._say(f"[island {island.index} gen {island.generation}] {record['action']}"
                  + (f" to snapshot {record['restored_index']}" if record["action"] == "backtrack"
                     else f" with island {record['partner']}")
                  + "  weights " + ", ".join(f"{k}={v:.3f}" for k, v in record["weights"].items()))

    def _update_global_best(self, island: Island, pid: str) -> None:
        """The island's new best becomes the run's when the run has none or it beats the run's best by
        the same rule (a duel already fought is not fought again)."""
        gb = self.global_best
        if gb is not None and gb["program"] != pid and not self._confirm(island, pid, gb["program"]):
            return
        self.global_best = {"program": pid, "island": island.index, "generation": island.generation,
                            "round": self.round}
        self._rescore()

    # -- the confirmed ranking (driver/ranking.py): head-to-heads, scores that follow them -------------

    def _confirm(self, island: Island, challenger: str, incumbent: str) -> bool:
        """Whether `challenger` takes the title from `incumbent` (ranking.Ledger.confirm). A head-to-head
        the evaluator could not finish decides nothing and is not kept: the title stays."""
        try:
            crowned, duel = self.ledger.confirm(challenger, incumbent, self.evals.again)
        except evaluations.HeadToHeadAborted:
            return False
        if duel is not None:
            self.rundir.event("head_to_head", island=island.index, generation=island.generation,
                              round=self.round, challenger=challenger, incumbent=incumbent, **duel)
            self._say(f"[island {island.index} gen {island.generation:>3}] head-to-head {challenger} vs {incumbent}: "
                      f"{self._metric_text(challenger)} vs {self._metric_text(incumbent)}: "
                      + ("the challenger takes the title" if crowned else "the title stays"))
        return crowned

    def _rescore(self) -> None:
        """Every copy of a program's score follows its confirmed figures; elites are ranked by them; the
        run's best carries its figures (best.py follows at the next checkpoint)."""
        for island in self.islands:
            for p in island.elites + ([island.best] if island.best else []):
                p.score = self._score_of(p.id)
            island.elites = sorted(island.elites, key=lambda p: p.score)[:TOURNAMENT_TOP_K]
        gb = self.global_best
        figures = self.ledger.summary(gb["program"]) if gb and gb["program"] in self.ledger.figures else None
        if figures:
            gb.update(figures)

    def write_best(self) -> None:
        """best.py for the checkpointed global best: written after each checkpoint (and on resume), so it
        never shows a program of a round a stop left unfinished; its header gives the measured figures.
        The checkpoint carries the same text (best_py), for a stop that comes between the two on the last
        round: resuming the finished run then only brings best.py up to date."""
        text = self.best_text()
        if text is not None:
            self.rundir.write_best_text(text)

    def best_text(self) -> str | None:
        gb = self.global_best
        if gb is None:
            return None
        standing = self.ledger.standing(gb["program"]) if gb["program"] in self.ledger.figures else ""
        header = report_md.best_header(self.task.name, hardware_name(self.device), self.s0, gb,
                                       self._metric_text(gb["program"]), standing)
        return self.rundir.best_text(gb, self.task.name, self.s0, hardware_name(self.device), header=header)

    # -- rounds, checkpoints --------------------------------------------------------------------

    def run(self) -> str:
        """Run rounds until the generation count or token budget is reached; returns why it stopped."""
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=len(self.islands))
        try:
            while self.round < self.cfg.generations:
                if self._over_budget():
                    return "token budget reached"
                if self.spend is not None and self.spend.stop_reason():
                    return self.spend.stop_reason()
                if self.spend is not None:
                    self.spend.round_started()
                gens = list(pool.map(self._generation, self.islands))
                if self.evals.discarded or self.evals.stop.requested():   # never checkpoint a dropped result
                    self.evals.stop.interrupt()
                refused = next((g for g in gens if isinstance(g, models.BudgetReached)), None)
                if refused is not None:   # as after Ctrl-C, the checkpoint stays at the last whole round
                    return f"{refused} (its round was cut short and runs again on resume)"
                self.round += 1
                for island, gen in zip(self.islands, gens):
                    self._record(island, gen)
                if self.llm_watch.tripped:   # no intervention on generations the LLM never served
                    self.checkpoint()
                    return (f"{self.llm_watch.limit} LLM calls in a row failed (last: "
                            f"{self.llm_watch.last_error})")
                if self.evals.error:   # every later candidate would fail the same way
                    self.checkpoint()
                    return f"the evaluator failed ({self.evals.error})"
                try:
                    if self.round < self.cfg.generations:   # after an island's last generation nothing can change
                        for island in self.islands:
                            self._intervene(island)
                except models.BudgetReached as e:   # a crossover's prune: the round is not checkpointed
                    return f"{e} (its round was cut short and runs again on resume)"
                if self.spend is not None:
                    self.spend.round_finished()
                self.checkpoint()
                write_html_report(self.rundir.path)
        finally:
            # on Ctrl-C, do not wait for the round in flight: its finished evaluations are stored, and any
            # that finishes from now on is dropped (the evaluator is closed next)
            self.evals.closed.set()
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
                "eval_seconds": self.evals.seconds, "eval_counts": self.evals.counts, "drifts": self.evals.drifts,
                "ledger": self.ledger.to_dict(), "remeasured": self.evals.remeasured, "unusable": self.unusable,
                "usage": {"main": _usage(self.llm_main), "secondary": _usage(self.llm_cheap)},
                "llm": self.llm_watch.to_dict(), "wall_s": self.wall_seconds(),
                "events": self.rundir.events_written, "transcript": self.transcript.lines,
                "device_facts": self.facts,
                "models": self.llm_main.state() if hasattr(self.llm_main, "credit") else None}

    def checkpoint(self) -> None:
        self.rundir.save_checkpoint(dict(self.state(), best_py=self.best_text()))
        self.write_best()

    def wall_seconds(self) -> float:
        return self.wall_before + time.time() - self.started

    def restore(self, state: dict) -> None:
        self.round = state["round"]
        self.islands = [Island.from_dict(d) for d in state["islands"]]
        self.global_best = state["global_best"]
        self.evals.seconds, self.evals.counts = state["eval_seconds"], state["eval_counts"]
        self.evals.drifts = state.get("drifts", [])
        self.ledger = ranking.Ledger.from_dict(self.s0, state.get("ledger", {}), self.ledger.rounds)
        for p in [p for i in self.islands for p in i.elites + [i.best] if p and p.id != REFERENCE]:
            self.ledger.figures.setdefault(p.id, ranking.Figures(self.s0 / p.score).to_dict())   # older checkpoints
        self.evals.remeasured = state.get("remeasured", 0)
        self.unusable = collections.Counter(state.get("unusable", {}))
        self.llm_watch.restore(state.get("llm", {}))
        if hasattr(self.llm_main, "credit"):   # the bandit's statistics, for the models still in --model
            self.llm_main.restore(state.get("models"))
        self.wall_before = state.get("wall_s", 0.0)
        self.rundir.truncate_events(state["events"])
        self.transcript.rewind(state.get("transcript"))
        self.write_best()   # a stop between a checkpoint and its best.py leaves the old one
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

    def _progress(self, island: Island, gen, score: float | None, cost: dict) -> None:
        result = console.generation_result(gen, score, self.s0, llm_check.failed_classes(gen.events),
                                           shown=self._metric_text(gen.program_id) if score else None)
        best = island.momentum.best
        glob = max(1.0, self.global_best["speedup"] if self.global_best else 1.0)   # the reference is 1.00x
        self._say(f"[island {island.index} gen {island.generation:>3}] idea {gen.idea_id}: {result:<24}"
                  f"  island best {self.s0 / best:.2f}x  global best {glob:.2f}x  "
                  f"m={island.momentum.value:.3f}  tokens {self.tokens():,}"
                  + console.spend_note(self.spend, cost, len(getattr(self.llm_main, "clients", ())) > 1))


def _usage(client) -> dict:
    return dict(getattr(client, "usage", {}) or {}) if client is not None else {}


def write_html_report(path: Path) -> None:
    """report.html from the run directory's files; a failure to draw it never stops a search."""
    try:
        report_html.write(path)
    except Exception as e:
        print(f"run.py: report.html not written: {type(e).__name__}: {e}", file=sys.stderr)


# ----------------------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    cfg = cli.parse_args(argv)   # a bad option exits 2 here, with one line
    stop, log = stopping.StopRequest(), startup.RunLog()
    try:
        with stop.installed():   # SIGINT and SIGTERM end a run the same way: report written, resumable
            return _main_with_messages(cfg, argv, stop, log)
    finally:
        log.close()


def _main(cfg: Config, given: set[str], stop: stopping.StopRequest | None = None,
          log: startup.RunLog | None = None) -> int:
    """Start (everything resolved once: driver/startup.py), run the islands, report."""
    stop = stop or stopping.StopRequest()
    if cfg.report:
        print(report_html.write(_run_dir_to_draw(cfg.report)))
        return 0
    say = (lambda line: None) if cfg.quiet else print
    s = startup.start(cfg, given, stop, log, say)
    search = None
    try:
        try:
            search = Search(s.cfg, s.task, s.evaluator, s.llm_main, s.llm_cheap, s.rd, s.s0, s.device,
                            book=s.book, facts=s.facts, stop=stop)
            if s.state:
                search.restore(s.state)
                say(f"resuming {s.rd.path} at round {search.round}")
            else:
                search.checkpoint()   # round 0: resumable from the first moment
                say(f"pacevolve: {s.task.name} on {hardware_name(s.device)}, reference {s.s0:.4g} ms, "
                    f"{s.cfg.islands} island{'s' * (s.cfg.islands != 1)}, run directory {s.rd.path}")
            why = search.run()
        finally:
            s.close()
    except KeyboardInterrupt:
        _stop_on_signal(stop, search, s.rd, startup.continue_with(s.cfg, s.rd.path))
    except replay.ReplayMismatch as e:
        print(f"run.py: {e}", file=sys.stderr)
        return EXIT_REPLAY_MISMATCH
    return _close(search, why, s)


def _main_with_messages(cfg: Config, argv: list[str] | None, stop: stopping.StopRequest,
                        log: startup.RunLog) -> int:
    """_main, with every problem before the search as one line (exit 2) and a finished run's note (exit 0)."""
    try:
        return _main(cfg, cli.given_options(argv), stop, log)
    except startup.Finished as e:
        print(f"run.py: {e}")
        return 0
    except (startup.SetupError, cli.UsageError, RunDirError, replay.ReplayError, llm_check.ProbeFailed) as e:
        print(f"run.py: {e}", file=sys.stderr)
        return 2
    except models.BudgetReached as e:   # the probes before the run do not fit in --budget-usd
        print(f"run.py: --budget-usd {cfg.budget_usd:g} does not cover the test calls before the run: {e}",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        stop.closing = True
        print(f"run.py: {stop.what} during set-up; " + (
            f"{cfg.resume} is unchanged" if cfg.resume else "no run directory was made"), file=sys.stderr)
        return stop.exit_code


def _close(search: Search, why: str, s: startup.Start) -> int:
    """The end of a run: report.md and report.html, the last lines, the exit code."""
    report = report_md.write_report(search, why)
    write_html_report(s.rd.path)
    cause = "llm" if search.llm_watch.tripped else "evaluator" if search.evals.error else ""
    gb = search.global_best
    done, fix = console.final_lines(why, cause, gb, search.s0, s.rd.path, report,
                                    shown=search._metric_text(gb["program"]) if gb else None)
    print(done)
    if why.startswith("dollar budget reached"):
        print(f"run.py: {startup.go_on(s.rd.path, search.spend)}")
    if s.recording:
        print(f"replay: {search.evals.evaluator.replay_summary()}")
    if fix:
        print(fix, file=sys.stderr)
    return {"llm": EXIT_LLM_FAILURES, "evaluator": EXIT_EVALUATOR_FAILED}.get(cause, 0)


def _run_dir_to_draw(path: str) -> Path:
    if not Path(path, "events.jsonl").exists() and not Path(path, "checkpoint.json").exists():
        raise startup.SetupError(f"--report {path}: not a run directory (no events.jsonl or checkpoint.json)")
    return Path(path)


def _stop_on_signal(stop: stopping.StopRequest, search: Search | None, rd: RunDir, advice: str):
    """After Ctrl-C or SIGTERM with the run directory made: the reports (once the search had started; the
    islands may still be finishing their round in worker threads), one line, exit 130 or 143."""
    def reports():
        if search is not None:
            report_md.write_report(search, stop.what)
            write_html_report(rd.path)
        rd.remove_leftovers()
    stopping.exit_after(stop, reports, advice)


if __name__ == "__main__":
    sys.exit(main())

"""Hierarchical Context Management (HCM): PACEvolve paper §3.1, App. B.2, Algorithm 1.

One call to `run_generation` is one generation of Algorithm 1 (P = IdeaPool, L = GlobalLog,
K_idea = HCMConfig.k_idea, K_hyp = HCMConfig.k_hyp):

    line 2       Proposals <- LLM_idea_gen(P)        main model; the same reply also names the idea to
                                                    test and its experiment (the selection of line 11,
                                                    made over P and the proposals, which is P after
                                                    lines 3-10)
    lines 3-10   classify every proposal against P   secondary model, one call for all proposals, in order:
                                                    refine an existing idea, or add a new one
    line 11      I_sel, H_new                        the choice above; a new selection call (main model)
                                                    only when it is missing or repeats the log
    line 12      H_new in L?                         a local word-overlap pre-filter; the secondary model
                                                    judges only when L holds similar experiments; a
                                                    repeat is sent back for another experiment
    line 13      Execute(H_new)                      main model writes the program from the parent's code,
                                                    then the caller's `execute`; failures go back to the
                                                    main model with the evaluator's message (repairs)
    lines 14-16  record the result on I_sel and in L (failures too)
    lines 17-20  |I_sel.history| > K_hyp -> summary  secondary model
    lines 21-24  |P| > K_idea -> prune               secondary model; dropped ideas move to L

A generation therefore makes 3 LLM calls when nothing else fires (idea generation, classification,
implementation; 2 on an empty pool), plus one per repair, duplicate check, re-selection, summary or
prune, and one format reminder per unusable reply.

Beyond the algorithm box (decisions the paper leaves open, and fixes to the official code):
  - failures (no program, compile/runtime/incorrect, duplicates) are recorded on the idea and in L;
  - an identical normalised program is never evaluated twice (see `program_hash`);
  - an unusable reply gets one format reminder; an LLM exception is a recorded failure, never a crash;
  - idea ids are never reused, so log entries stay unambiguous (the official code renumbers);
  - prompts have a size budget: history that does not fit loses whole records, with a count;
  - a record keeps the planned experiment and the implementer's own words on what it built; two
    proposals refining one idea in one classification batch are both kept (merge_descriptions);
  - replies reach the parsers exactly as the LLM sent them; every unusable one is a note that
    `count_unusable` reads, per prompt kind.
`merge_pools` and `prune_pool` serve crossover (§3.3): bring a partner island's ideas in, then cap P.
Not here: parent selection, backtracking and the crossover decision (run.py, momentum.py, crossover.py),
the evaluator (evaluate_kernel/), the task background (driver/prompt_background.py). Lower score is better
throughout.
The state lives in hcm_state.py, the prompts in hcm_prompts.py, the reply parsers in hcm_parsers.py.
"""
from __future__ import annotations

import random
import re
from dataclasses import asdict, dataclass, field
from typing import Callable

from hcm_parsers import (Choice, Selection, code_problem, extract_code, parse_choice, parse_classifications,
                         parse_drop_list, parse_duplicate_verdict, parse_ideas, parse_implemented,
                         parse_selection, parse_summary)
from hcm_prompts import (CLASSIFY_PROMPT, DUPLICATE_NOTE, DUPLICATE_PROMPT, IDEA_GEN_PROMPT,
                         IMPLEMENT_PROMPT, PRUNE_PROMPT, REMINDER, REPAIR_PROMPT, SELECT_PROMPT,
                         SUMMARY_PROMPT, code_block, drop_example, legend_line, locate, plural, prompt_kind,
                         render_dropped, render_idea_records, render_log_entries, render_pool, render_record,
                         shows_results)
from hcm_state import (GlobalLog, Hypothesis, Idea, IdeaPool, Outcome, clip, merge_descriptions, merge_pools,
                       program_hash, program_id, record)

LLM = Callable[[str], str]


@dataclass(frozen=True)
class HCMConfig:
    n_proposals: int = 3          # ideas per generation round: App. B.2.3 ("develop 3 different options")
    k_idea: int = 5               # K_idea, max ideas in P: official code's --idea_cap default
    k_hyp: int = 20               # K_hyp, max history per idea: official code's --summarize_freq default
    max_format_retries: int = 1   # reminders of the answer format after an unusable reply
    max_duplicate_retries: int = 2  # times a repeated experiment is sent back for a different one
    max_repairs: int = 2          # repair attempts for a failed candidate (contract with run.py)
    prompt_chars: int = 24_000    # size budget of one prompt; the pool's records give way first
    similarity: float = 0.5       # word overlap (Jaccard) at which a logged experiment goes to the LLM check
    max_similar: int = 8          # most similar logged experiments shown to the duplicate check

    def __post_init__(self):
        if self.k_idea < 1 or self.k_hyp < 1 or self.n_proposals < 1:
            raise ValueError(f"k_idea, k_hyp and n_proposals must be >= 1, got {self}")


@dataclass
class TaskContext:
    name: str
    background: str               # device, contract, rules (run.py writes it with driver/prompt_background.py)
    direction: str = "score = runtime in ms, lower is better"
    reference: str = ""           # the reference program (the function to reproduce), shown once per prompt
    brief: str = ""               # short background for the planning prompts (default: background)
    legend: str = ""              # what a result's figures mean: said once in every prompt showing results


@dataclass
class Parent:
    source: str                   # the program this generation improves on
    metric: str = "not measured"  # its measured metric text
    program_id: str | None = None  # the caller's id for it (None for the reference)
    role: str = "parent"          # how it was chosen, e.g. "parent, chosen by tournament"
    is_reference: bool = False    # the parent is the reference program itself
    best: str = ""                # the island's best result when it is not this parent ("" otherwise)
    best_program_id: str | None = None


@dataclass
class GenerationResult:
    status: str                   # evaluated | duplicate_program | duplicate_experiment | no_program |
                                  # no_selection | no_ideas | llm_error | execute_error
    idea_id: int | None = None
    experiment: str = ""
    program: str | None = None    # the last evaluated (or rejected duplicate) program
    program_id: str = ""
    outcome: Outcome | None = None
    attempts: list[dict] = field(default_factory=list)   # every evaluation: program_id + Outcome fields
    strong_calls: int = 0
    cheap_calls: int = 0
    calls: dict[str, int] = field(default_factory=dict)   # LLM calls by prompt kind, reminders included
    events: list[str] = field(default_factory=list)
    parent_id: str | None = None  # Parent.program_id of the program this generation improved on

    @property
    def llm_calls(self) -> int:
        return self.strong_calls + self.cheap_calls

    def to_dict(self) -> dict:
        d = asdict(self)
        d["llm_calls"] = self.llm_calls
        return d


def run_generation(pool: IdeaPool, log: GlobalLog, *, task: TaskContext, parent: Parent, llm: LLM,
                   execute: Callable[[str], Outcome], config: HCMConfig = HCMConfig(),
                   cheap_llm: LLM | None = None, rng: random.Random | None = None) -> GenerationResult:
    """Returns the result of one generation of Algorithm 1; mutates `pool` (P) and `log` (L) in place.
    `llm` generates ideas, chooses and writes programs and repairs them; `cheap_llm` (default: llm)
    classifies, checks for repeats, summarises and prunes. `rng` is accepted for interface stability:
    HCM makes no random draws (every choice is the LLM's or deterministic), so runs are reproducible."""
    result = GenerationResult(status="no_ideas", parent_id=parent.program_id)
    caller = _Caller(llm, cheap_llm, config.max_format_retries, result.events)
    try:
        _run(_Generation(pool, log, task, parent, config, caller, result.events), execute, result)
    finally:
        result.strong_calls, result.cheap_calls, result.calls = caller.strong, caller.cheap, caller.kinds
    return result


def _run(g: _Generation, execute, result: GenerationResult) -> None:
    """One generation, step by step in the order of Algorithm 1."""
    proposals, choice, failed = _generate_ideas(g)                      # line 2
    placed = _classify(g, proposals)                                     # lines 3-10
    if not g.pool.ideas:
        result.status = "llm_error" if failed else "no_ideas"
        return
    idea, experiment, status = _choose(g, choice, placed, result)        # lines 11-12
    if status is None:
        _implement_and_evaluate(g, idea, experiment, execute, result)    # lines 13-16
    idea = g.pool.get(result.idea_id)
    if idea is not None and idea.history_size() > g.cfg.k_hyp:          # line 17
        _summarise(g, idea)                                              # lines 18-19
    if len(g.pool.ideas) > g.cfg.k_idea:                                 # line 21
        _prune(g)                                                        # lines 22-23


def prune_pool(pool: IdeaPool, log: GlobalLog, *, llm: LLM, config: HCMConfig = HCMConfig(),
               task: TaskContext | None = None) -> list[str]:
    """Returns notes on what was pruned; applies Alg. 1 lines 21-24 outside a generation (e.g. after
    a crossover merged another island's ideas in). No LLM call when |P| <= K_idea."""
    events: list[str] = []
    if len(pool.ideas) > config.k_idea:
        caller = _Caller(llm, None, config.max_format_retries, events)
        _prune(_Generation(pool, log, task or TaskContext("the task", ""), Parent(""), config, caller, events))
    return events


# ----------------------------------------------------------------------------------------------------
# The steps of a generation.

@dataclass
class _Generation:
    pool: IdeaPool
    log: GlobalLog
    task: TaskContext
    parent: Parent
    cfg: HCMConfig
    caller: _Caller
    events: list[str]


def _generate_ideas(g: _Generation) -> tuple[list[str], Choice | None, bool]:
    """Alg. 1 line 2, with the choice of line 11. Returns the proposals, the choice (None when the reply
    has none) and whether the LLM call failed."""
    ids = g.pool.ids()
    # the reference is shown while it is the parent; later the parent's code comes with the implementation
    shown = bool(g.task.reference) and g.parent.is_reference
    fields = dict(task=g.task.name, background=g.task.brief or g.task.background,
                  reference=code_block(g.task.reference if shown else "",
                                       "Reference program (`Model` is the function to reproduce):"),
                  parent=_parent_text(g, reference_shown=shown), dropped=render_dropped(g.log),
                  legend=_legend(g), uncovered=_uncovered(g), n=g.cfg.n_proposals,
                  count=plural(g.cfg.n_proposals, "idea") + ", then the choice",
                  novelty=(" At least one idea must lie outside every existing idea."
                           if len(ids) <= g.cfg.k_idea else ""),
                  valid_ids=f" (ids: {', '.join(map(str, ids))})" if ids else "")
    prompt = _fit(IDEA_GEN_PROMPT, fields, g)
    reply = g.caller.ask(prompt, lambda t: (parse_ideas(t) or None, "no 'Idea: ...' entries found"))
    return (reply.value or [])[:g.cfg.n_proposals], parse_choice(reply.text), reply.llm_error


def _classify(g: _Generation, proposals: list[str]) -> dict[int, int]:
    """Alg. 1 lines 3-10 for all proposals in one call. Returns proposal number (1-based) -> idea id.
    On an empty pool every proposal is a new idea and no call is made."""
    placed: dict[int, int] = {}
    if not proposals:
        return placed
    if not g.pool.ideas:
        for k, proposal in enumerate(proposals, start=1):
            placed[k] = g.pool.add(proposal).id
            g.events.append(f"new idea {placed[k]}: {proposal}")
        return placed
    ids, n = g.pool.ids(), len(proposals)

    def check(text: str) -> tuple[dict | None, str]:
        found = parse_classifications(text, n)
        bad = [k for k, c in found.items() if c.exists and c.idea_id not in ids]
        missing = [k for k in range(1, n + 1) if k not in found]
        if bad:
            k = bad[0]
            return None, f"proposal {k} names idea {found[k].idea_id}, not in the repository (valid ids: {ids})"
        if missing:
            return None, f"no classification for proposal {', '.join(map(str, missing))}"
        return found, ""

    listed = "\n".join(f"Proposal {k}: {p}" for k, p in enumerate(proposals, start=1))
    prompt = CLASSIFY_PROMPT.format(task=g.task.name, pool=render_pool(g.pool, _budget(g, 2000), records=False),
                                    proposals=listed, count=plural(n, "section"))
    reply = g.caller.ask(prompt, check, cheap=True)     # line 4, for every proposal at once
    found = reply.value if reply.value is not None else parse_classifications(reply.text, n)
    refined: set[int] = set()                           # ideas this batch has updated already
    for k, proposal in enumerate(proposals, start=1):   # in order: lines 5-8
        c = found.get(k)
        if c is not None and c.exists and g.pool.get(c.idea_id) is not None:
            idea = g.pool.get(c.idea_id)
            if c.description:   # a second update of one idea adds to the first instead of replacing it
                idea.description = (merge_descriptions(idea.description, c.description) if idea.id in refined
                                    else c.description)
                refined.add(idea.id)
            g.events.append(f"merged proposal {k} into idea {idea.id}: {proposal}")
        else:
            answered = c is not None and not c.exists
            idea = g.pool.add(c.description if answered else proposal)
            g.events.append(f"new idea {idea.id}" + ("" if answered else " (classification failed: kept as new)")
                            + f": {idea.description}")
        placed[k] = idea.id
    return placed


def _choose(g: _Generation, choice: Choice | None, placed: dict[int, int],
            result: GenerationResult) -> tuple[Idea | None, str, str | None]:
    """Alg. 1 lines 11-12: I_sel and H_new, checked against L. Returns (idea, experiment, None) to go on,
    or (idea, experiment, status) when the generation ends here (recorded)."""
    idea, experiment = None, ""
    if choice is not None:
        chosen = placed.get(choice.proposal) if choice.proposal else choice.idea_id
        idea, experiment = g.pool.get(chosen), choice.experiment
    note = ""
    for round_ in range(1 + g.cfg.max_duplicate_retries):
        if idea is None:                                          # no usable choice: select again
            reply, sel = _select(g, note)
            if reply.llm_error and sel is None:
                result.status = "llm_error"
                return None, "", "llm_error"
            idea = g.pool.get(sel.idea_id) if sel else None
            if sel is not None and idea is None and sel.experiment:
                # a hallucinated id, even after the reminder: the experiment becomes an idea of its own,
                # so its result is not attributed to an unrelated idea
                idea = g.pool.add(sel.experiment)
                g.events.append(f"missing or unknown idea id {sel.idea_id}; recorded under new idea {idea.id}")
            experiment = sel.experiment if sel else ""
            if idea is None:
                result.status = "no_selection"
                record(g.log, None, Hypothesis(experiment or "(no selection)", status="no_selection",
                                               result=f"no_selection: {reply.reason}"))
                return None, experiment, "no_selection"
        experiment = experiment or "(experiment not described)"
        result.idea_id, result.experiment = idea.id, experiment
        repeat = _is_repeat(g, idea, experiment)                  # line 12: H_new in L?
        if not repeat:
            return idea, experiment, None
        if round_ < g.cfg.max_duplicate_retries:
            g.events.append(f"experiment repeats logged {repeat}; asking for a different one")
            note = DUPLICATE_NOTE.format(what=f"'{experiment}' repeats '{repeat.split(': ', 1)[-1]}'")
            idea = None
    result.status = "duplicate_experiment"
    record(g.log, idea, Hypothesis(experiment, status="duplicate_experiment",
                                   result=f"not evaluated: repeats an experiment already run: "
                                          f"{repeat.split(': ', 1)[-1]}"))
    return idea, experiment, "duplicate_experiment"


def _select(g: _Generation, note: str) -> tuple[_Reply, Selection | None]:
    """Alg. 1 line 11 on its own: I_sel, H_new <- LLM_select(P). Returns the reply and the last parsed
    selection (possibly invalid, for the fallbacks)."""
    ids = g.pool.ids()
    fields = dict(task=g.task.name, background=g.task.brief or g.task.background,
                  parent=_parent_text(g, reference_shown=False), dropped=render_dropped(g.log), note=note,
                  legend=_legend(g), uncovered=_uncovered(g), valid_ids=", ".join(map(str, ids)))

    def check(text: str) -> tuple[Selection | None, str]:
        s = parse_selection(text)
        if s is None or s.idea_id is None:
            return None, "no 'Idea ID: <id>' line"
        if s.idea_id not in ids:
            return None, f"Idea ID {s.idea_id} is not in the repository (valid ids: {ids})"
        if not s.experiment:
            return None, "no 'Experiment: ...' line"
        return s, ""

    reply = g.caller.ask(_fit(SELECT_PROMPT, fields, g), check)
    return reply, (reply.value if reply.value is not None else parse_selection(reply.text))


_STOPWORDS = frozenset("""a an and are as at be by for from in into is it its of on or per the then this to
use using with each than that their them via""".split())


def _words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z0-9_]+(?:\.[0-9]+)?", text.lower()) if w not in _STOPWORDS}


def similar_experiments(log: GlobalLog, experiment: str, threshold: float, limit: int) -> list[int]:
    """Returns the numbers (1-based) of executed log entries whose experiment shares at least `threshold`
    of its words with `experiment` (Jaccard), most similar first: the local pre-filter of line 12."""
    mine = _words(experiment)
    scored = []
    for n, e in enumerate(log.tried, start=1):
        theirs = _words(e.hypothesis.experiment)
        if e.hypothesis.attempts and mine and theirs:
            overlap = len(mine & theirs) / len(mine | theirs)
            if overlap >= threshold:
                scored.append((-overlap, -n))
    return [-n for _, n in sorted(scored)[:limit]]


def _is_repeat(g: _Generation, idea: Idea, experiment: str) -> str:
    """Returns the logged experiment that H_new repeats ("#n: text"), or "" (Alg. 1 line 12). An exact
    text match costs no call; the LLM judges only when the log holds similar executed experiments."""
    key = " ".join(experiment.lower().split())
    if experiment == "(experiment not described)":
        return ""
    for n, e in enumerate(g.log.tried, start=1):
        if e.hypothesis.attempts and " ".join(e.hypothesis.experiment.lower().split()) == key:
            return f"#{n}: {e.hypothesis.experiment}"
    similar = similar_experiments(g.log, experiment, g.cfg.similarity, g.cfg.max_similar)
    if not similar:
        return ""
    shown = [g.log.tried[n - 1].hypothesis for n in similar]
    prompt = DUPLICATE_PROMPT.format(task=g.task.name, log=render_log_entries(g.log, sorted(similar)),
                                     legend=legend_line(g.task.legend, shows_results(records=shown)),
                                     idea_id=idea.id, idea=idea.description, experiment=experiment)
    reply = g.caller.ask(prompt, lambda t: (parse_duplicate_verdict(t), "no 'Repeat: yes/no' line"), cheap=True)
    if reply.value is None or not reply.value[0]:
        return ""
    n = reply.value[1]
    if n and 1 <= n <= len(g.log.tried):
        return f"#{n}: {g.log.tried[n - 1].hypothesis.experiment}"
    return f"#{similar[0]}: {g.log.tried[similar[0] - 1].hypothesis.experiment}"


def _implement_and_evaluate(g: _Generation, idea: Idea, experiment: str, execute, result: GenerationResult) -> None:
    """Alg. 1 lines 13-16: the main model writes H_new's program from the parent, it is evaluated (with
    repairs), and the result is recorded on I_sel and in L."""
    parent = g.parent
    fields = dict(task=g.task.name, background=g.task.background,
                  reference="",   # a candidate parent passed the evaluator: it carries the contract itself
                  parent_role=parent.role, parent_metric=parent.metric, parent_source=parent.source.strip(),
                  legend=legend_line(g.task.legend, True), idea_id=idea.id, idea=idea.description,
                  experiment=experiment)
    skeleton = IMPLEMENT_PROMPT.format(records="", **fields)
    records = render_idea_records(idea, max(0, g.cfg.prompt_chars - len(skeleton)))
    fields["legend"] = legend_line(g.task.legend, not parent.is_reference or "  - [ok]" in records)
    prompt = IMPLEMENT_PROMPT.format(records=records, **fields)
    reply = g.caller.ask(prompt, lambda t: (extract_code(t), code_problem(t)))
    if reply.value is None:
        status = "llm_error" if reply.llm_error else "no_program"
        result.status = status
        record(g.log, idea, Hypothesis(experiment, status=status, result=f"{status}: {reply.reason}"))
        return
    program, built = reply.value, parse_implemented(reply.text)
    result.program, result.program_id = program, program_id(program)
    h = program_hash(program)
    if h in g.log.program_hashes or h == program_hash(parent.source):   # the same program: free check
        result.status = "duplicate_program"
        what = "the parent program" if h == program_hash(parent.source) else "an already evaluated program"
        record(g.log, idea, Hypothesis(experiment, result.program_id, "duplicate_program",
                                       result=f"not evaluated: identical to {what}", implemented=built))
        return
    program, outcome, built = _evaluate_with_repairs(g, program, built, idea, experiment, execute, result)
    result.program, result.program_id, result.outcome = program, program_id(program), outcome
    result.status = "execute_error" if outcome.status == "execute_error" else "evaluated"
    lines = [f"{a['program_id']}: {_one_liner(Outcome.from_dict(a))}" for a in result.attempts]
    one = _one_liner(outcome) + (f" (after {plural(len(lines) - 1, 'repair')})" if len(lines) > 1 else "")
    record(g.log, idea, Hypothesis(experiment, result.program_id, outcome.status, outcome.score,
                                   outcome.metric, one, lines, built))               # lines 14-15


def _evaluate_with_repairs(g: _Generation, program: str, built: str, idea: Idea, experiment: str, execute,
                           result: GenerationResult) -> tuple[str, Outcome, str]:
    """Alg. 1 line 13 plus the repair loop. Returns (final program, final Outcome, what the implementer
    says the final program does)."""
    parent_hash = program_hash(g.parent.source)
    reference = code_block(g.task.reference, "Reference program (`Model` is the function to reproduce):")
    while True:
        pid = program_id(program)
        outcome = _execute(execute, program)          # line 13: Result <- Execute(H_new)
        result.attempts.append({"program_id": pid, **outcome.to_dict()})
        if outcome.status != "execute_error":
            g.log.program_hashes.add(program_hash(program))
        repairs = len(result.attempts) - 1
        if outcome.status in ("ok", "execute_error") or repairs >= g.cfg.max_repairs:
            return program, outcome, built
        prompt = REPAIR_PROMPT.format(task=g.task.name, background=g.task.background, reference=reference,
                                      idea_id=idea.id, idea=idea.description, experiment=experiment,
                                      status=outcome.status, program=program.strip(),
                                      message=outcome.message or "(no message)")
        reply = g.caller.ask(prompt, lambda t: (extract_code(t), code_problem(t)))
        if reply.value is None:
            g.events.append(f"repair {repairs + 1} gave no program: {reply.reason}")
            return program, outcome, built
        h = program_hash(reply.value)
        if h in g.log.program_hashes or h == parent_hash:
            g.events.append(f"repair {repairs + 1} returned an already evaluated program; stopping repairs")
            return program, outcome, built
        g.events.append(f"repair {repairs + 1} after {outcome.status}")
        program, built = reply.value, parse_implemented(reply.text) or built


def _summarise(g: _Generation, idea: Idea) -> None:
    """Alg. 1 lines 17-20: I_sel.history <- {Summary}. The best result stays beside the idea (its
    best_metric), so the summary need not repeat it."""
    prompt = SUMMARY_PROMPT.format(task=g.task.name, direction=g.task.direction, idea_id=idea.id,
                                   idea=idea.description, best=idea.best_metric or "none yet",
                                   summary=idea.summary or "(none)",
                                   records="\n".join(render_record(h) for h in idea.hypotheses),
                                   legend=legend_line(g.task.legend, shows_results(ideas=[idea])))
    reply = g.caller.ask(prompt, lambda t: (parse_summary(t), "no 'Key findings:' line"), cheap=True)
    ok = sum(h.status == "ok" for h in idea.hypotheses)
    text = reply.value or (f"{idea.summary} " if idea.summary else "") + \
        f"{plural(len(idea.hypotheses), 'more experiment')}, {ok} successful (summary call failed)."
    g.events.append(f"summarised idea {idea.id} ({idea.history_size()} history entries > K_hyp={g.cfg.k_hyp})")
    idea.summary, idea.hypotheses = text, []


def _weakest_first(ideas: list[Idea]) -> list[Idea]:
    """Ideas ordered for deterministic pruning: no success first, then worst best score, then oldest."""
    return sorted(ideas, key=lambda i: (i.best_score is not None, -(i.best_score or 0.0), i.id))


def _prune(g: _Generation) -> None:
    """Alg. 1 lines 21-24: drop exactly |P| - K_idea ideas, chosen by the LLM; pruned ideas go to L."""
    pool, n_drop, ids = g.pool, len(g.pool.ideas) - g.cfg.k_idea, g.pool.ids()
    fields = dict(task=g.task.name, direction=g.task.direction, cap=g.cfg.k_idea, n_drop=n_drop,
                  ids_word="id" if n_drop == 1 else "ids", example=drop_example(n_drop),
                  legend=legend_line(g.task.legend, shows_results(pool)))
    reply = g.caller.ask(_fit(PRUNE_PROMPT, fields, g),
                         lambda t: (parse_drop_list(t), "no 'Dropping Ideas: [ids]' list"), cheap=True)
    named = list(dict.fromkeys(reply.value or []))
    invalid = [i for i in named if i not in ids]
    chosen = [i for i in named if i in ids][:n_drop]
    if invalid:
        g.events.append(f"prune: ignored ids not in the pool: {invalid}")
    if len([i for i in named if i in ids]) > n_drop:
        g.events.append(f"prune: LLM named more than {n_drop}; dropping the first {n_drop} named")
    if len(chosen) < n_drop:
        extra = [i.id for i in _weakest_first(pool.ideas) if i.id not in chosen][:n_drop - len(chosen)]
        g.events.append(f"prune: LLM named {len(chosen)} of {n_drop}; also dropping weakest/oldest {extra}")
        chosen += extra
    for idea in [i for i in pool.ideas if i.id in chosen]:
        pool.ideas.remove(idea)
        g.log.pruned.append(idea)
    g.events.append(f"pruned ideas {sorted(chosen)} (|P| > K_idea={g.cfg.k_idea})")


# ----------------------------------------------------------------------------------------------------
# Helpers: prompt assembly within the budget, the LLM caller, results in one line.

def _legend(g: _Generation) -> str:
    """The figures' legend for the idea and selection prompts: they show the parent's result, the
    island's best and the pool's (the reference's own time needs none)."""
    shown = not g.parent.is_reference or bool(g.parent.best) or shows_results(g.pool, g.log.pruned)
    return legend_line(g.task.legend, shown)


def _uncovered(g: _Generation) -> str:
    """ "that no record above covers", where the prompt shows records."""
    return " that no record above covers" if any(i.hypotheses for i in g.pool.ideas) else ""


def count_unusable(notes: list[str]) -> dict[str, int]:
    """Returns, per prompt kind, how many replies could not be used (each got a format reminder, or was
    the reminder's answer), read from a generation's or prune_pool's notes."""
    counts: dict[str, int] = {}
    for note in notes:
        if m := re.match(r"unusable (\w+) reply: ", note):
            counts[m.group(1)] = counts.get(m.group(1), 0) + 1
    return counts


def _budget(g: _Generation, used: int) -> int:
    return max(0, g.cfg.prompt_chars - used)


def _fit(template: str, fields: dict, g: _Generation) -> str:
    """Formats a template whose {pool} gets what the budget leaves after everything else."""
    skeleton = template.format(pool="", **fields)
    return template.format(pool=render_pool(g.pool, _budget(g, len(skeleton))), **fields)


def _parent_text(g: _Generation, reference_shown: bool) -> str:
    """The parent as the idea and selection prompts state it: how it was chosen, its result, where its
    record is, and the island's best result when that is another program. The reference's code is
    pointed at only where the prompt shows it."""
    p = g.parent
    what = ("the PyTorch reference itself (class Model, shown above)" if reference_shown
            else "the PyTorch reference itself" if p.is_reference else "")
    lines = [f"{p.role[:1].upper()}{p.role[1:]}: {p.metric}" + (f"; {what}" if what else ".")]
    if where := locate(g.pool, g.log, p.program_id):
        lines.append(f"Its record: {where}.")
    if p.best:
        where = locate(g.pool, g.log, p.best_program_id)
        lines.append(f"Island best so far: {p.best}" + (f" ({where})" if where else "") + ".")
    elif p.program_id or p.is_reference:
        lines.append("It is the island's best program so far.")
    return "\n".join(lines)


@dataclass
class _Reply:
    value: object = None
    reason: str = ""
    llm_error: bool = False
    text: str = ""


class _Caller:
    """Calls the strong or cheap LLM, counts calls, and gives one format reminder per unusable reply."""

    def __init__(self, llm: LLM, cheap_llm: LLM | None, retries: int, events: list[str]):
        self.llm, self.cheap_llm, self.retries, self.events = llm, cheap_llm, retries, events
        self.strong = self.cheap = 0
        self.kinds: dict[str, int] = {}

    def ask(self, prompt: str, parse: Callable[[str], tuple[object, str]], cheap: bool = False) -> _Reply:
        fn = self.cheap_llm if cheap and self.cheap_llm is not None else self.llm
        reason, text = "", ""
        for attempt in range(1 + self.retries):
            if fn is self.llm:
                self.strong += 1
            else:
                self.cheap += 1
            self.kinds[prompt_kind(prompt)] = self.kinds.get(prompt_kind(prompt), 0) + 1
            try:
                text = _ask(fn, prompt if attempt == 0 else prompt + REMINDER.format(reason=reason),
                            prompt_kind(prompt), attempt)
            except Exception as exc:  # any client failure is a recorded failure, never a crash
                msg = f"LLM call failed ({prompt_kind(prompt)}): {type(exc).__name__}: {clip(exc, 300)}"
                self.events.append(msg)
                return _Reply(reason=msg, llm_error=True, text=text)
            text = text if isinstance(text, str) else ""
            value, reason = parse(text)
            if value is not None:
                return _Reply(value=value, text=text)
            self.events.append(f"unusable {prompt_kind(prompt)} reply: {reason}")
        self.events.append(f"no usable {prompt_kind(prompt)} reply after {plural(self.retries, 'format reminder')}")
        return _Reply(reason=reason, text=text)


def _ask(fn, prompt: str, purpose: str, attempt: int) -> str:
    """Calls the LLM. A recorder of the run's transcript (driver/transcript.py) says so with `takes_purpose` and is
    told the prompt's kind and whether this is a format reminder; any other LLM is a plain (prompt) -> str."""
    if getattr(fn, "takes_purpose", False):
        return fn(prompt, purpose=purpose, attempt=attempt)
    return fn(prompt)


def _execute(execute, program: str) -> Outcome:
    try:
        out = execute(program)
    except Exception as exc:  # the caller's evaluator broke: a recorded failure, not a crash
        return Outcome("execute_error", message=f"{type(exc).__name__}: {clip(exc, 300)}")
    if isinstance(out, Outcome):
        return out
    return Outcome("execute_error", message=f"execute returned {type(out).__name__}")


def _one_liner(outcome: Outcome) -> str:
    """The result of a record: the metric, or the status with the evaluator's message (up to 400
    characters: evaluator messages are short by contract; this bounds a broken one, with a mark)."""
    if outcome.status == "ok":
        return outcome.metric or f"score {outcome.score}"
    return f"{outcome.status}: {clip(outcome.message or 'no message', 400)}"


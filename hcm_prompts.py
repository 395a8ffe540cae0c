"""HCM prompts (PACEvolve App. B.2.3): the templates and the rendering of the idea pool, the log and the
programs into them, within a size budget.

Every template's first line is a marker that `prompt_kind` reads, so fakes and logs can tell the prompts
apart. Which prompt shows what (no prompt carries the same code twice):

    idea_generation  background, reference, parent's measured result and lineage, pool, dropped ideas;
                     asks for n proposals, then the idea to test and its experiment (Alg. 1 lines 2, 11)
    classification   pool descriptions and all of a generation's proposals, classified in one reply
    selection        a new choice of idea and experiment when the first repeated the log (line 11 again)
    duplicate_check  the proposed experiment and only the logged experiments similar to it (line 12)
    implementation   background, reference, the parent's code, the idea and its records, the experiment
    repair           background, reference, the failing program and the evaluator's message
    summary, prune   an idea's records / the pool, for the secondary model (lines 17-24)

Records are never cut: a pool that does not fit its budget loses whole records, oldest first, and says
how many; an idea's key findings stand for what its summarised records held. A record shows the planned
experiment and, when the implementer described it, what the program built does. A prompt that shows
results says once what their figures mean (TaskContext.legend), and no prompt points at text it does not
hold: "above", "shown" and the like appear only beside what they name (tests/test_hcm.py checks every kind).
"""
from __future__ import annotations

import re

from hcm_state import GlobalLog, Idea, IdeaPool

MARKER = "[pacevolve prompt: {kind}]"

IDEA_GEN_PROMPT = MARKER.format(kind="idea_generation") + """
We are running an evolutionary search that improves a program for the task "{task}".

## Background
{background}
{reference}
## Parent program
{parent}
{legend}
## Idea repository
Each idea is a direction we have explored; its records are the experiments run to test it.
{pool}
{dropped}
## Your task
Brainstorm {n} distinct directions that could beat the parent program. For each, explain the change and why
you expect it to help. Learn from the repository first: work out why designs did well or badly, do not
re-propose directions that were tested thoroughly or dropped, and leave ideas whose results have plateaued.
Balance new directions against tuning promising ones; a risky idea is welcome when it teaches us something
about the problem.{novelty}
Then choose what to test next, one of your proposals or an idea in the repository{valid_ids}, and state one
concrete experiment for it: a specific change to the parent program{uncovered}.
The parent's code comes with the request to write the program.

## Answer format ({count})
Idea 1
Idea: <the direction, one or two specific sentences>
Reasoning: <why it should help>

Idea 2
Idea: ...
Reasoning: ...

Choice: <proposal k, or idea N of the repository>
Experiment: <the concrete change, one or two sentences>
"""

CLASSIFY_PROMPT = MARKER.format(kind="classification") + """
We keep a repository of optimisation ideas for the task "{task}":
{pool}

New proposals, in order:
{proposals}

## Your task
Decide for each proposal whether it belongs to an idea already in the repository. It belongs to one when it
relies on the same underlying technique, even if the implementation details or parameters differ. A proposal
that combines two quite different existing ideas is a new idea, and so is one you cannot describe together
with the existing idea in two sentences. Descriptions must name the technique specifically, in at most two
sentences.

## Answer format (one section per proposal, in order: {count})
Proposal 1
Idea Exists: True
Idea ID: <id from the repository>
Updated description: <the existing description refined with the proposal>

Proposal 2
Idea Exists: False
Idea description: <the proposal as a specific idea>
"""

SELECT_PROMPT = MARKER.format(kind="selection") + """
We are running an evolutionary search that improves a program for the task "{task}".

## Background
{background}

## Parent program
{parent}
{legend}
## Idea repository
{pool}
{dropped}{note}
## Your task
Pick one idea from the repository (valid idea ids: {valid_ids}) and design one concrete experiment that tests
it: a specific change to the parent program{uncovered}.
The parent's code comes with the request to write the program.

## Answer format
Idea ID: <one of {valid_ids}>
Experiment: <the concrete change, one or two sentences>
"""

DUPLICATE_PROMPT = MARKER.format(kind="duplicate_check") + """
Logged experiments for the task "{task}" that resemble a new proposal (numbers are log entries):
{log}
{legend}
Proposed experiment (idea {idea_id}: {idea}):
{experiment}

## Your task
Does the proposal repeat one of these logged experiments, i.e. test essentially the same change, so that its
result can be read off the log? Trying a parameter value or a combination that was not tried is not a repeat.

## Answer format
Repeat: <yes or no>
Entry: <number of the logged experiment it repeats, or none>
"""

IMPLEMENT_PROMPT = MARKER.format(kind="implementation") + """
We are running an evolutionary search that improves a program for the task "{task}".

## Background
{background}
{reference}
## Parent program ({parent_role}): {parent_metric}
{legend}```python
{parent_source}
```

## Experiment to implement
Idea {idea_id}: {idea}
{records}Experiment: {experiment}

## Your task
Write the complete new program: the parent program with the experiment's change, self-contained, defining
`class ModelNew`.

## Answer format
Implemented: <one or two sentences on what your program does, as built (say so where it departs from the
experiment)>
Then the complete program in one ```python code block; the last code block of your reply is evaluated.
"""

REPAIR_PROMPT = MARKER.format(kind="repair") + """
We are running an evolutionary search that improves a program for the task "{task}".

## Background
{background}
{reference}
## Experiment being implemented
Idea {idea_id}: {idea}
Experiment: {experiment}

## Program that failed the evaluator (status: {status})
```python
{program}
```

## Evaluator message
{message}

## Your task
Find the cause and fix the program while keeping the experiment's intent. Do not work around the checks
(no fallback paths, no lowered precision, no try/except).

## Answer format
Cause: <one or two sentences>
Implemented: <what the corrected program does, in one or two sentences>
Then the complete corrected program in one ```python code block.
"""

SUMMARY_PROMPT = MARKER.format(kind="summary") + """
An idea explored for the task "{task}" ({direction}) and its experiment records:
Idea {idea_id}: {idea}
Best result so far: {best} (kept beside the idea; do not restate it)
Earlier key findings: {summary}
Records:
{records}
{legend}
## Your task
Condense the records into key findings in at most four sentences: which experiment gave the best result,
what worked and what did not, and why where the records show it.

## Answer format
Key findings: <text>
"""

PRUNE_PROMPT = MARKER.format(kind="prune") + """
The idea repository for the task "{task}" ({direction}):
{pool}
{legend}
## Your task
We keep at most {cap} ideas, so exactly {n_drop} must be dropped. Prefer dropping ideas that the results
clearly invalidate, ideas explored thoroughly that still trail the best result, ideas with little room left
to close the gap, and old ideas without recent progress. Keep ideas that could still bring a breakthrough.

## Answer format
Dropping Ideas: <Python list of exactly {n_drop} idea {ids_word}, e.g. {example}>
"""

REMINDER = """

## Format reminder
Your previous reply could not be used: {reason}. Reply again and follow the answer format above exactly."""

DUPLICATE_NOTE = """
## Note
Your previous proposal repeated an experiment already run ({what}). Choose a different experiment.
"""


def prompt_kind(prompt: str) -> str:
    """Returns the kind of an HCM prompt ("selection", "repair", ...) from its marker line, else "unknown"."""
    m = re.search(r"^\[pacevolve prompt: ([a-z_]+)\][ \t]*$", prompt, re.M)
    return m.group(1) if m else "unknown"


def plural(n: int, word: str, words: str | None = None) -> str:
    """Returns "1 record", "3 records" (or the given plural)."""
    return f"{n} {word if n == 1 else (words or word + 's')}"


def code_block(src: str, label: str) -> str:
    """Returns a labelled python block, or "" for no source."""
    return f"\n{label}\n```python\n{src.strip()}\n```\n" if src.strip() else ""


def drop_example(n: int) -> str:
    """Returns an example id list with exactly n entries, e.g. "[2, 5]" for 2."""
    return "[" + ", ".join(str(k) for k in (2, 5, 7, 8, 11, 12, 14, 16)[:max(1, n)]) + \
        (", ..." if n > 8 else "") + "]"


def render_record(h) -> str:
    """One record: the planned experiment, what the implementer says it built (when it said), the result."""
    built = f" | built: {h.implemented}" if getattr(h, "implemented", "") else ""
    return f"  - [{h.status}] {h.experiment}{built} -> {h.result}"


def legend_line(legend: str, shown: bool) -> str:
    """The line saying what result figures mean, for a prompt that shows results ("" otherwise)."""
    return f"Figures: {legend}\n" if legend and shown else ""


def shows_results(pool: IdeaPool | None = None, ideas: list | None = None, records: list | None = None) -> bool:
    """Whether rendered text holds a measured result: an idea's best, a successful record."""
    ideas = list(ideas or []) + (pool.ideas if pool else [])
    return any(i.best_metric for i in ideas) or any(h.status == "ok" for h in records or [])


def render_pool(pool: IdeaPool, budget: int | None = None, records: bool = True) -> str:
    """Returns the idea repository as prompt text: per idea its experiment count, best result, key
    findings and records, each whole (records=False: descriptions, counts and findings only, for the
    classification). When the text would pass `budget` characters, the oldest records of the ideas with
    the most records shown are left out whole, and each idea says how many."""
    if not pool.ideas:
        return "(empty: no ideas yet)"
    shown = {i.id: (len(i.hypotheses) if records else 0) for i in pool.ideas}
    text = _render_pool(pool, shown, records)
    while budget is not None and len(text) > budget and any(shown.values()):
        # the idea with the most records shown gives up its oldest one (ties: the oldest idea)
        victim = max(pool.ideas, key=lambda i: (shown[i.id], -i.id))
        shown[victim.id] -= 1
        text = _render_pool(pool, shown, records)
    return text


def _render_pool(pool: IdeaPool, shown: dict[int, int], records: bool) -> str:
    out = []
    for idea in pool.ideas:
        best = idea.best_metric or "no successful experiment yet"
        out.append(f"Idea ID: {idea.id} | experiments: {idea.tried}" + (f" | best: {best}" if records else ""))
        out.append(f"  Description: {idea.description}")
        if idea.summary:
            out.append(f"  Key findings: {idea.summary}")
        k = shown[idea.id]
        hidden = len(idea.hypotheses) - k
        if hidden > 0 and records:
            out.append(f"  ({plural(hidden, 'earlier record')} not shown)" if k else
                       f"  ({plural(hidden, 'record')} not shown)")
        out += [render_record(h) for h in (idea.hypotheses[-k:] if k > 0 else [])]
    return "\n".join(out)


def render_dropped(log: GlobalLog, limit: int = 10) -> str:
    """Returns the most recently dropped ideas (whole, each description once), so they are not proposed
    again."""
    if not log.pruned:
        return ""
    seen: dict[str, list[Idea]] = {}
    for idea in log.pruned:
        seen.setdefault(" ".join(idea.description.lower().split()), []).append(idea)
    groups = list(seen.values())
    lines = ["", "Dropped ideas (do not propose them again without a new angle):"]
    if len(groups) > limit:
        lines.append(f"({plural(len(groups) - limit, 'older dropped idea')} not shown)")
    for ideas in groups[-limit:]:
        best = min((i for i in ideas if i.best_score is not None), key=lambda i: i.best_score, default=None)
        findings = "; ".join(dict.fromkeys(i.summary for i in ideas if i.summary))
        times = f", dropped {len(ideas)} times" if len(ideas) > 1 else ""
        lines.append(f"- {ideas[-1].description} (best: {best.best_metric if best else 'none'}{times}"
                     + (f"; findings: {findings}" if findings else "") + ")")
    return "\n".join(lines) + "\n"


def render_log_entries(log: GlobalLog, numbers: list[int]) -> str:
    """Returns the given log entries (1-based numbers), each whole."""
    lines = []
    for n in numbers:
        e = log.tried[n - 1]
        lines.append(f"#{n} [idea {e.idea_id}: {e.idea}] {e.hypothesis.experiment} -> {e.hypothesis.result}")
    return "\n".join(lines)


def render_idea_records(idea: Idea, budget: int) -> str:
    """Returns an idea's key findings and records for the implementation prompt, newest kept within
    `budget` characters, whole records only."""
    lines = [f"Key findings: {idea.summary}"] if idea.summary else []
    recs = [render_record(h) for h in idea.hypotheses]
    while recs and len("\n".join(lines + recs)) > budget:
        recs.pop(0)
    hidden = len(idea.hypotheses) - len(recs)
    if recs or hidden:
        lines.append("Records of this idea:" + (f" ({plural(hidden, 'earlier record')} not shown)" if hidden else ""))
    return "\n".join(lines + recs) + "\n" if lines or recs else ""


def locate(pool: IdeaPool, log: GlobalLog, program_id: str | None) -> str:
    """Returns where the record of a program is: its idea and experiment in the pool, else in the log."""
    if not program_id:
        return ""
    for idea in pool.ideas:
        for h in reversed(idea.hypotheses):
            if h.program_id == program_id:
                return f"idea {idea.id}, experiment: {h.experiment}"
    for e in reversed(log.tried):
        if e.hypothesis.program_id == program_id:
            where = "" if pool.get(e.idea_id) else " (no longer in the repository)"
            return f"idea {e.idea_id}{where}, experiment: {e.hypothesis.experiment}"
    return ""

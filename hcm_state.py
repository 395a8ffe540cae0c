"""The state of Hierarchical Context Management (PACEvolve §3.1): the idea pool P, the global log L,
their records, and what "the same program" means.

    Outcome     what an evaluation returns (contract with the caller's execute callback)
    Hypothesis  one experiment and its result (a record), failures included
    Idea        a conceptual idea with its records, key findings and best result
    IdeaPool    P; ids are never reused
    GlobalLog   L: every tried hypothesis, every pruned idea, every evaluated program's hash
    record()    Algorithm 1 lines 14-15: a result goes on its idea and into L
    merge_descriptions()  two refinements of one idea in one classification batch, both kept
    clip()      the one way text is shortened: at a word, with a mark saying how much was cut
    merge_pools()  crossover (§3.3): a partner's ideas join P; matching ideas receive the partner's records
    program_hash() the duplicate filter's identity of a program (comments and layout ignored)
    parse_python() ast.parse, safe to call from several threads at once

Everything round-trips through JSON (to_dict / from_dict); unknown keys are ignored so older and newer
snapshots load.
"""
from __future__ import annotations

import ast
import hashlib
import re
import threading
from dataclasses import asdict, dataclass, field, fields

STATE_VERSION = 1

# CPython 3.11 before 3.11.8 keeps ast.parse's recursion count once per interpreter, so two
# threads parsing at once (the islands do) can fail with "AST constructor recursion depth mismatch". Every
# parse in the process takes one lock; it is kept on the ast module so that the evaluator's screen, which
# imports nothing of ours, finds the same one.
_PARSE_LOCK = ast.__dict__.setdefault("_pacevolve_parse_lock", threading.RLock())


def _from(cls, d: dict):
    """Builds a dataclass from a dict, ignoring unknown keys so older/newer snapshots still load."""
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in d.items() if k in names})


@dataclass
class Outcome:
    """What `execute(program_src)` returns (contract shared with run.py)."""
    status: str                 # "ok" or a failure status string
    score: float | None = None  # lower is better (runtime in ms for kernels); None when failed
    metric: str = ""            # human-readable, e.g. "1.84x speedup (1.92 ms vs 3.53 ms)"
    message: str = ""           # evaluator feedback (used for repairs and one-line results)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Outcome:
        return _from(cls, d)


@dataclass
class Hypothesis:
    """One experiment (a micro-level hypothesis, §3.1) and its result; failures included."""
    experiment: str
    program_id: str = ""        # short normalised-program hash; "" when no program was produced
    status: str = ""            # an Outcome status, or "no_program" / "duplicate_program" / ...
    score: float | None = None
    metric: str = ""
    result: str = ""            # one line for prompts
    attempts: list[str] = field(default_factory=list)   # one line per evaluated attempt (repairs)
    implemented: str = ""       # the implementer's own words on what the program does, as built

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Hypothesis:
        return _from(cls, d)


@dataclass
class Idea:
    """A macro-level conceptual idea (§3.1) with its hypothesis records."""
    id: int
    description: str
    hypotheses: list[Hypothesis] = field(default_factory=list)
    summary: str = ""           # key findings of records compressed away (Alg. 1 lines 17-20)
    tried: int = 0              # experiments ever recorded, summarised ones included
    best_score: float | None = None
    best_metric: str = ""
    origins: list[str] = field(default_factory=list)   # "island 1#4": ideas of other pools it came from

    def history_size(self) -> int:
        """Returns |I.history| of Alg. 1 line 17: the records plus one for a summary."""
        return len(self.hypotheses) + (1 if self.summary else 0)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Idea:
        idea = _from(cls, d)
        idea.hypotheses = [Hypothesis.from_dict(h) for h in d.get("hypotheses", [])]
        return idea


@dataclass
class IdeaPool:
    """P of Algorithm 1. Ids are never reused (next_id only grows), so log entries stay unambiguous after
    pruning; a caller that restores an older pool keeps the newer next_id (see run.py's backtrack)."""
    ideas: list[Idea] = field(default_factory=list)
    next_id: int = 1

    def get(self, idea_id: int | None) -> Idea | None:
        return next((i for i in self.ideas if i.id == idea_id), None)

    def add(self, description: str) -> Idea:
        idea = Idea(id=self.next_id, description=description)
        self.next_id += 1
        self.ideas.append(idea)
        return idea

    def ids(self) -> list[int]:
        return [i.id for i in self.ideas]

    def to_dict(self) -> dict:
        return {"version": STATE_VERSION, "ideas": [i.to_dict() for i in self.ideas], "next_id": self.next_id}

    @classmethod
    def from_dict(cls, d: dict) -> IdeaPool:
        ideas = [Idea.from_dict(i) for i in d.get("ideas", [])]
        return cls(ideas=ideas, next_id=d.get("next_id", max([i.id for i in ideas], default=0) + 1))


@dataclass
class LogEntry:
    """One tried hypothesis in the global log, with the idea it tested."""
    idea_id: int | None
    idea: str
    hypothesis: Hypothesis

    def to_dict(self) -> dict:
        return {"idea_id": self.idea_id, "idea": self.idea, "hypothesis": self.hypothesis.to_dict()}

    @classmethod
    def from_dict(cls, d: dict) -> LogEntry:
        return cls(d.get("idea_id"), d.get("idea", ""), Hypothesis.from_dict(d.get("hypothesis", {})))


@dataclass
class GlobalLog:
    """L of Algorithm 1: permanent memory of every tried hypothesis, pruned idea and evaluated program."""
    tried: list[LogEntry] = field(default_factory=list)
    pruned: list[Idea] = field(default_factory=list)
    program_hashes: set[str] = field(default_factory=set)   # program_hash() of every evaluated program

    def to_dict(self) -> dict:
        return {"version": STATE_VERSION, "tried": [e.to_dict() for e in self.tried],
                "pruned": [i.to_dict() for i in self.pruned], "program_hashes": sorted(self.program_hashes)}

    @classmethod
    def from_dict(cls, d: dict) -> GlobalLog:
        return cls(tried=[LogEntry.from_dict(e) for e in d.get("tried", [])],
                   pruned=[Idea.from_dict(i) for i in d.get("pruned", [])],
                   program_hashes=set(d.get("program_hashes", [])))


def record(log: GlobalLog, idea: Idea | None, hyp: Hypothesis) -> None:
    """Alg. 1 lines 14-15: the record goes on the idea and into the permanent log (failures too)."""
    if idea is not None:
        idea.hypotheses.append(hyp)
        idea.tried += 1
        _update_best(idea, hyp)
    log.tried.append(LogEntry(idea.id if idea else None, idea.description if idea else "", hyp))


def merge_descriptions(first: str, second: str) -> str:
    """Returns one description holding two refinements of the same idea: `first`, then the sentences of
    `second` it does not already hold (ignoring case and spacing)."""
    have = {_description_key(x) for x in _sentences(first)}
    extra = [x for x in _sentences(second) if _description_key(x) not in have]
    return " ".join([first.strip()] + extra).strip()


def _sentences(text: str) -> list[str]:
    return [x for x in re.split(r"(?<=[.!?;])\s+", " ".join(text.split())) if x]


def clip(text: str, limit: int) -> str:
    """Returns `text` on one line, whole when it has at most `limit` characters; otherwise cut at the last
    word boundary before `limit`, followed by a mark such as "[cut: 1,234 more characters]"."""
    text = " ".join(str(text).split())
    if len(text) <= limit:
        return text
    head = text[:limit]
    head = head[:head.rfind(" ")] if " " in head[limit // 2:] else head   # a whole word when one is near
    return f"{head.rstrip()} [cut: {len(text) - len(head.rstrip()):,} more characters]"


def _update_best(idea: Idea, hyp: Hypothesis) -> None:
    if hyp.status == "ok" and hyp.score is not None and (idea.best_score is None or hyp.score < idea.best_score):
        idea.best_score, idea.best_metric = hyp.score, hyp.metric


def merge_pools(dst: IdeaPool, src: IdeaPool, src_name: str = "", dst_name: str = "") -> list[int]:
    """Returns the ids in `dst` that received something from `src` (crossover, paper §3.3), in `src`'s
    order. An incoming idea that matches one in `dst`, by lineage (one was copied from the other, as
    recorded in `origins` under the pool names) or by description (ignoring case and spacing), gives that
    idea the records it lacks; any other incoming idea is copied with its records, summary and best
    result under a fresh id. Nothing is dropped. Call prune_pool afterwards."""
    added = []
    for idea in src.ideas:
        lineage = set(idea.origins) | ({f"{src_name}#{idea.id}"} if src_name else set())
        key = _description_key(idea.description)
        match = next((d for d in dst.ideas
                      if lineage & (set(d.origins) | ({f"{dst_name}#{d.id}"} if dst_name else set()))), None) \
            or next((d for d in dst.ideas if _description_key(d.description) == key), None)
        if match is None:
            match = Idea.from_dict(idea.to_dict())
            match.id, dst.next_id = dst.next_id, dst.next_id + 1
            match.origins = sorted(lineage)
            dst.ideas.append(match)
        elif not _merge_records(match, idea, lineage):
            continue
        added.append(match.id)
    return added


def _merge_records(dst: Idea, src: Idea, lineage: set[str]) -> bool:
    """Gives `dst` the records and findings of `src` that it lacks; returns whether anything changed."""
    have = {_record_key(h) for h in dst.hypotheses}
    new = [Hypothesis.from_dict(h.to_dict()) for h in src.hypotheses if _record_key(h) not in have]
    findings = src.summary and src.summary not in dst.summary
    for h in new:
        dst.hypotheses.append(h)
        _update_best(dst, h)
    if src.best_score is not None and (dst.best_score is None or src.best_score < dst.best_score):
        dst.best_score, dst.best_metric = src.best_score, src.best_metric
    if findings:
        dst.summary = f"{dst.summary} {src.summary}".strip()
    # summarised experiments of the partner count once, the records just copied once each
    dst.tried += len(new) + (max(0, src.tried - len(src.hypotheses)) if findings else 0)
    dst.origins = sorted(set(dst.origins) | lineage)
    return bool(new or findings)


def _record_key(h: Hypothesis) -> tuple:
    return h.experiment, h.program_id, h.status, h.result


def _description_key(text: str) -> str:
    return " ".join(text.lower().split())


# ----------------------------------------------------------------------------------------------------
# Program normalisation (the duplicate filter's notion of "the same program").

def _normalise_embedded(text: str) -> str:
    """Strips C/C++ comments and whitespace-only differences from a string literal (CUDA sources)."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    lines = (" ".join(line.split()) for line in text.splitlines())
    return "\n".join(line for line in lines if line)


class _StringNormaliser(ast.NodeTransformer):
    def visit_Constant(self, node: ast.Constant) -> ast.Constant:
        if isinstance(node.value, str):
            node.value = _normalise_embedded(node.value)
        return node


def normalise_program(src: str) -> str:
    """Returns a canonical form of a program: Python comments, blank lines and layout are dropped
    (ast round-trip), and in every string literal (where load_inline CUDA/C++ lives) C comments are
    removed, runs of spaces collapsed and blank lines dropped. Idempotent. Source that does not parse
    falls back to dropping '#' comment lines and collapsing whitespace."""
    try:
        tree = _StringNormaliser().visit(parse_python(src.replace("\r\n", "\n")))
        return ast.unparse(tree)
    except (SyntaxError, ValueError, RecursionError):
        lines = (" ".join(line.split("#", 1)[0].split()) for line in src.splitlines())
        return "\n".join(line for line in lines if line)


def parse_python(src: str) -> ast.Module:
    """ast.parse, one thread at a time (see _PARSE_LOCK)."""
    with _PARSE_LOCK:
        return ast.parse(src)


def program_hash(src: str) -> str:
    """Returns the sha256 hex digest of the normalised program."""
    return hashlib.sha256(normalise_program(src).encode()).hexdigest()


def program_id(src: str) -> str:
    return program_hash(src)[:12]

"""Hierarchical Context Management (HCM): PACEvolve paper §3.1, App. B.2, Algorithm 1.

One call to `run_generation` is one generation of Algorithm 1:
  lines 2-10   idea generation (n proposals), then classification of each proposal against the idea
               pool P: refine an existing idea's description, or add a new idea;
  line 11      selection: the LLM picks an idea I_sel, states a concrete experiment H_new and writes the
               full candidate program;
  lines 12-16  duplicate filter against the global log L, execution, record on I_sel and in L;
  lines 17-20  hypothesis-level pruning: |I_sel.history| > K_hyp -> history replaced by a summary;
  lines 21-24  idea-level pruning: |P| > K_idea -> the LLM names ideas to drop; they move to L.
Symbols: P = IdeaPool, L = GlobalLog, K_idea = HCMConfig.k_idea, K_hyp = HCMConfig.k_hyp.

Beyond the algorithm box (decisions the paper leaves open, and fixes to the official code):
  - failures (no program, compile/runtime/incorrect, duplicates) are recorded on the idea and in L;
  - a failed candidate goes back to the LLM with the evaluator message (the repair loop), max_repairs;
  - an identical normalised program is never evaluated twice (see `normalise_program`);
  - an unusable reply gets one format reminder; an LLM exception is a recorded failure, never a crash;
  - idea ids are never reused, so log entries stay unambiguous (the official code renumbers).
`merge_pools` and `prune_pool` serve crossover (§3.3): copy a partner island's ideas in, then cap P.
Not implemented here: parent selection, backtracking and the crossover decision (run.py, momentum.py,
crossover.py), the evaluator (evaluate_kernel.py). Lower score is better throughout (runtime in ms for kernels).
"""
from __future__ import annotations

import ast
import hashlib
import random
import re
from dataclasses import asdict, dataclass, field, fields
from typing import Callable

STATE_VERSION = 1

# ----------------------------------------------------------------------------------------------------
# Prompt templates (structure of App. B.2.3: background, current best program with its measured metric,
# the idea repository with results, instructions, exact answer format). The first line of every template
# is a stable marker that `prompt_kind` reads, so fakes and logs can tell the prompts apart.

MARKER = "[pacevolve prompt: {kind}]"

KERNEL_BACKGROUND = """You are writing fast, correct GPU code for PyTorch on an {gpu_name}.

Task: {task_description}
{reference_block}
What to write (the KernelBench contract):
- One self-contained Python module defining `class ModelNew(torch.nn.Module)`. Its constructor takes the same
  arguments as `Model.__init__` and its `forward` the same arguments as `Model.forward`; it must compute the
  same function. Create parameters the way `Model` does (same modules and parameters, same order), because
  both models are initialised from the same seed and their weights must match.
- Custom CUDA/C++ goes through `torch.utils.cpp_extension.load_inline` (give the extension a unique name).
  Mixing custom kernels with PyTorch or cuDNN calls is allowed.
- Inputs arrive as float32 tensors already on the GPU; outputs must be float32 with the reference's shapes.

How the evaluator judges a program:
- Correctness: outputs are compared with the reference under a tight relative tolerance ({tolerance}) on several
  input distributions (other seeds, scales and signs) and with re-seeded weights. Full fp32 accuracy is needed:
  fp16, bf16 or TF32 arithmetic usually fails.
- Speed: runtime is timed with CUDA events, a device-wide synchronisation and an L2 flush before each call;
  the score is the measured runtime, compared with the reference's.
- Rejected outright: try/except fallbacks, extra threads or CUDA streams that hide work from the timer,
  caching or reusing outputs between calls, subclassing or calling `Model`, tensor subclasses, patching
  timers. A fast wrong answer scores nothing; write honest kernels."""

IDEA_GEN_PROMPT = MARKER.format(kind="idea_generation") + """
We are running an evolutionary search that improves a program for the task "{task}".

## Background
{background}

## Current best program
Measured: {parent_metric}
({direction})
```python
{parent_source}
```

## Idea repository
Each idea is a direction we have explored; its records are the experiments run to test it.
{pool}
{dropped}
## Your task
Brainstorm {n} distinct directions that could beat the current best program. For each, explain the change,
why you expect it to help, and why it is worth an experiment. Learn from the repository first: work out why
designs did well or badly, do not re-propose directions that were tested thoroughly or dropped, and leave
ideas whose results have plateaued. Balance new directions against tuning promising ones; a risky idea is
welcome when it teaches us something about the problem.{novelty}

## Answer format (exactly {n} ideas)
Idea 1
Idea: <the direction, one or two specific sentences>
Reasoning: <why it should help>

Idea 2
Idea: ...
Reasoning: ...
"""

CLASSIFY_PROMPT = MARKER.format(kind="classification") + """
We keep a repository of optimisation ideas for the task "{task}":
{pool}

A new proposal:
{proposal}

## Your task
Decide whether the proposal belongs to an idea already in the repository. It belongs to one when it relies
on the same underlying technique, even if the implementation details or parameters differ. A proposal that
combines two quite different existing ideas is a new idea, and so is one you cannot describe together with
the existing idea in two sentences. Descriptions must name the technique specifically, in at most two
sentences.

## Answer format (one of the two)
If it belongs to an existing idea:
Idea Exists: True
Idea ID: <id from the repository>
Updated description: <the existing description refined with the proposal, at most two sentences>

If it is new:
Idea Exists: False
Idea description: <the proposal as a specific idea, at most two sentences>
"""

SELECT_PROMPT = MARKER.format(kind="selection") + """
We are running an evolutionary search that improves a program for the task "{task}".

## Background
{background}

## Current best program
Measured: {parent_metric}
({direction})
```python
{parent_source}
```

## Idea repository
{pool}
{dropped}{note}
## Your task
Pick one idea from the repository (valid idea ids: {valid_ids}) and design one concrete experiment that tests
it: a specific change to the current best program, not one already recorded above. Then write the complete
new program, self-contained, defining `class ModelNew`.

## Answer format
Idea ID: <one of {valid_ids}>
Experiment: <concise, concrete description of the change>
Then the complete program in one ```python code block; the last code block of your reply is evaluated.
"""

DUPLICATE_PROMPT = MARKER.format(kind="duplicate_check") + """
Experiments already run for the task "{task}" (newest last; dropped ideas included):
{log}

Proposed experiment (idea {idea_id}: {idea}):
{experiment}

## Your task
Does the proposal repeat a logged experiment, i.e. test essentially the same change, so that its result can
be read off the log? Trying a parameter value or a combination that was not tried is not a repeat.

## Answer format
Repeat: <yes or no>
Entry: <number of the logged experiment it repeats, or none>
"""

REPAIR_PROMPT = MARKER.format(kind="repair") + """
We are running an evolutionary search that improves a program for the task "{task}".

## Background
{background}

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
One or two sentences on the cause, then the complete corrected program in one ```python code block.
"""

SUMMARY_PROMPT = MARKER.format(kind="summary") + """
An idea explored for the task "{task}" ({direction}) and its experiment records:
Idea {idea_id}: {idea}
Earlier key findings: {summary}
Records:
{records}

## Your task
Condense the records into key findings: start with the best result and the experiment that gave it, then
say what worked and what did not, in at most four sentences.

## Answer format
Key findings: <text>
"""

PRUNE_PROMPT = MARKER.format(kind="prune") + """
The idea repository for the task "{task}" ({direction}):
{pool}

## Your task
We keep at most {cap} ideas, so exactly {n_drop} must be dropped. Prefer dropping ideas that the results
clearly invalidate, ideas explored thoroughly that still trail the best result, ideas with little room left
to close the gap, and old ideas without recent progress. Keep ideas that could still bring a breakthrough.

## Answer format
Dropping Ideas: <Python list of {n_drop} idea ids, e.g. [3]>
"""

REMINDER = """

## Format reminder
Your previous reply could not be used: {reason}. Reply again and follow the answer format above exactly."""

DUPLICATE_NOTE = """
## Note
Your previous proposal repeated a logged experiment ({what}). Choose a different experiment.
"""


def kernel_background(hardware: str, task_description: str, reference_src: str = "",
                      tolerance: str = "about 1e-4 relative") -> str:
    """Returns the background section for a KernelBench task (hardware, contract, evaluator rules)."""
    block = f"\nReference program (`Model` is the function to reproduce):\n```python\n{reference_src.strip()}\n```\n" \
        if reference_src.strip() else ""
    return KERNEL_BACKGROUND.format(gpu_name=hardware, task_description=task_description.strip(),
                                    reference_block=block, tolerance=tolerance)


def prompt_kind(prompt: str) -> str:
    """Returns the kind of an HCM prompt ("selection", "repair", ...) from its marker line, else "unknown"."""
    m = re.search(r"^\[pacevolve prompt: ([a-z_]+)\][ \t]*$", prompt, re.M)
    return m.group(1) if m else "unknown"


# ----------------------------------------------------------------------------------------------------
# State: plain dataclasses with JSON-friendly to_dict/from_dict.

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
    """P of Algorithm 1. Ids are never reused, so log entries stay unambiguous after pruning."""
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


@dataclass(frozen=True)
class HCMConfig:
    n_proposals: int = 3          # ideas per generation round: App. B.2.3 ("develop 3 different options")
    k_idea: int = 5               # K_idea, max ideas in P: official code's --idea_cap default
    k_hyp: int = 20               # K_hyp, max history per idea: official code's --summarize_freq default
    max_format_retries: int = 1   # reminders of the answer format after an unusable reply
    max_duplicate_retries: int = 2  # times a repeated experiment is sent back for a different one
    max_repairs: int = 2          # repair attempts for a failed candidate (contract with run.py)
    records_shown: int = 3        # most recent records per idea rendered into prompts (bounds prompt size)
    max_log_lines: int = 80       # most recent log entries shown to the duplicate check

    def __post_init__(self):
        if self.k_idea < 1 or self.k_hyp < 1 or self.n_proposals < 1:
            raise ValueError(f"k_idea, k_hyp and n_proposals must be >= 1, got {self}")


@dataclass
class TaskContext:
    name: str
    background: str               # e.g. kernel_background(...)
    direction: str = "score = runtime in ms, lower is better"


@dataclass
class Parent:
    source: str                   # the program this generation improves on
    metric: str = "not measured"  # its measured metric text
    program_id: str | None = None  # the caller's id for it (informational; None for the reference)


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
    events: list[str] = field(default_factory=list)
    parent_id: str | None = None  # Parent.program_id of the program this generation improved on

    @property
    def llm_calls(self) -> int:
        return self.strong_calls + self.cheap_calls

    def to_dict(self) -> dict:
        d = asdict(self)
        d["llm_calls"] = self.llm_calls
        return d


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
        tree = _StringNormaliser().visit(ast.parse(src.replace("\r\n", "\n")))
        return ast.unparse(tree)
    except (SyntaxError, ValueError, RecursionError):
        lines = (" ".join(line.split("#", 1)[0].split()) for line in src.splitlines())
        return "\n".join(line for line in lines if line)


def program_hash(src: str) -> str:
    """Returns the sha256 hex digest of the normalised program."""
    return hashlib.sha256(normalise_program(src).encode()).hexdigest()


def program_id(src: str) -> str:
    return program_hash(src)[:12]


# ----------------------------------------------------------------------------------------------------
# Parsers: they accept what LLMs really write and return None (never raise) when there is no answer.

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")


def _fenced_blocks(text: str) -> tuple[list[str], bool]:
    """Returns the complete fenced blocks of a reply and whether it ends inside an unterminated fence."""
    blocks, current, fence = [], [], None
    for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        m = _FENCE.match(line)
        if fence is None:
            if m and not (m.group(1)[0] == "`" and "`" in m.group(2)):
                fence, current = m.group(1), []
        elif m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not m.group(2).strip():
            blocks.append("\n".join(current))
            fence = None
        else:
            current.append(line)
    return blocks, fence is not None


def _defines_model_new(code: str) -> bool:
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return False
    return any(isinstance(n, ast.ClassDef) and n.name == "ModelNew" for n in tree.body)


def extract_code(text: str) -> str | None:
    """Returns the candidate program: the last complete fenced block (``` or ~~~, any tag) that defines
    a top-level `class ModelNew` and parses as Python. None when the reply ends inside an unterminated
    fence (truncated output) or no block qualifies. A reply without fences that is itself such a
    program is accepted."""
    if not isinstance(text, str):
        return None
    blocks, unterminated = _fenced_blocks(text)
    if unterminated:
        return None
    if not blocks:
        plain = text.replace("\r\n", "\n").strip()
        return plain + "\n" if _defines_model_new(plain) else None
    for code in reversed(blocks):
        if _defines_model_new(code):
            return code.strip("\n") + "\n"
    return None


def code_problem(text: str) -> str:
    """Returns why extract_code found no program (for the format reminder)."""
    blocks, unterminated = _fenced_blocks(text or "")
    if unterminated:
        return "the reply ends inside an unterminated code block (probably cut off); keep the reply shorter"
    if not blocks:
        return "the reply has no fenced code block with the program"
    for code in reversed(blocks):
        if re.search(r"^\s*class\s+ModelNew\b", code, re.M):
            try:
                ast.parse(code)
            except SyntaxError as exc:
                return f"the code defining ModelNew does not parse (line {exc.lineno}: {exc.msg})"
    return "no code block defines a top-level `class ModelNew`"


def _plain_lines(text: str) -> list[str]:
    """Returns the lines of a reply outside code fences, with markdown decoration (bold, headers,
    bullets, numbering, quotes) stripped from their starts."""
    out, in_fence = [], None
    for line in (text or "").replace("\r\n", "\n").split("\n"):
        m = _FENCE.match(line)
        if m and (in_fence is None or m.group(1)[0] == in_fence[0]):
            in_fence = m.group(1) if in_fence is None else None
            continue
        if in_fence is not None:
            continue
        line = re.sub(r"^\s*\*(?=\S)|(?<=:)\*", "", re.sub(r"\*\*|`", "", line))   # bold, code, italics
        line = re.sub(r"^\s*(>\s*)*(#{1,6}\s*)?([-*+•]\s+)?(\(?\d{1,2}[.)]\s+)?", "", line)
        out.append(line.strip())
    return out


_LABEL = r"^(?P<label>{names})\s*(?:\(\w+\))?(?:\s*[:：=]|\s+[-–—]\s)\s*(?P<rest>.*)$"


def _labelled(lines: list[str], names: str) -> list[tuple[int, str]]:
    """Returns (line index, text after the label) for lines starting with one of the labels."""
    rx = re.compile(_LABEL.format(names=names), re.I)
    return [(k, m.group("rest").strip()) for k, line in enumerate(lines) if (m := rx.match(line))]


def _paragraph(lines: list[str], start: int, first: str, stop: str = r"$^") -> str:
    """Returns `first` plus the following lines up to a blank line or a line matching `stop`."""
    parts = [first] if first else []
    for line in lines[start + 1:]:
        if (not line and parts) or re.match(stop, line, re.I):
            break
        if line:
            parts.append(line)
    return " ".join(" ".join(parts).split())


def parse_ideas(text: str) -> list[str]:
    """Returns the idea texts of an idea-generation reply ("Idea: ..." fields, or "Idea 2: ..."
    headers when the label is missing), in order, without duplicates; [] when there are none."""
    lines = _plain_lines(text)
    header = re.compile(r"^(?:idea|option|proposal|direction)\s*#?\s*(\d+)\s*[:.)–—-]?\s*(.*)$", re.I)
    stop = r"^(reasoning|rationale|why|expected impact|idea|option|proposal|direction)\b"
    ideas: list[str] = []
    label_rx = re.compile(_LABEL.format(names=r"idea|idea description|description|hypothesis"), re.I)
    for k, line in enumerate(lines):
        if m := label_rx.match(line):
            ideas.append(_paragraph(lines, k, m.group("rest").strip(), stop))
        elif (h := header.match(line)) and h.group(2).strip():
            # "Idea 2: text" counts unless an "Idea:" field follows before the next header
            nxt = next((ln for ln in lines[k + 1:] if header.match(ln) or label_rx.match(ln)), "")
            if not label_rx.match(nxt):
                ideas.append(_paragraph(lines, k, h.group(2).strip(), stop))
    ideas = [re.split(r"\s+reasoning\s*:", i, flags=re.I)[0].strip() for i in ideas]  # "Idea: x. Reasoning: y"
    seen: set[str] = set()
    return [i for i in ideas if i and not (i.lower() in seen or seen.add(i.lower()))]


@dataclass
class Classification:
    exists: bool
    idea_id: int | None
    description: str


def _first_int(text: str) -> int | None:
    m = re.search(r"-?\d+", text)
    return int(m.group()) if m else None


def parse_classification(text: str) -> Classification | None:
    """Returns the classification of one proposal, or None when the reply has no usable answer."""
    lines = _plain_lines(text)
    stop = r"^(idea exists|idea id|updated description|idea description|reasoning|explanation)\b"
    exists = _labelled(lines, r"idea exists|exists")
    ids = _labelled(lines, r"idea id|id")
    updated = _labelled(lines, r"updated description|updated idea description|updated idea")
    new = _labelled(lines, r"idea description|new idea description|description")
    verdict = exists[0][1].lower() if exists else ""
    says_yes = verdict.startswith(("true", "yes"))
    says_no = verdict.startswith(("false", "no"))
    if says_yes or (not says_no and ids and updated):
        idea_id = _first_int(ids[0][1]) if ids else None
        if idea_id is None:
            return None
        desc = _paragraph(lines, updated[0][0], updated[0][1], stop) if updated else ""
        return Classification(True, idea_id, desc)
    if says_no or new:
        if not new:
            return None
        desc = _paragraph(lines, new[0][0], new[0][1], stop)
        return Classification(False, None, desc) if desc else None
    return None


@dataclass
class Selection:
    idea_id: int | None
    experiment: str
    code: str | None


def parse_selection(text: str) -> Selection | None:
    """Returns the chosen idea id, experiment and program of a selection reply; None when it has
    neither an idea id nor an experiment. `code` is None when extract_code finds no program."""
    lines = _plain_lines(text)
    ids = [_first_int(rest) for _, rest in _labelled(lines, r"(?:selected |chosen )?idea id")]
    # "Idea: 2" / "Selected idea: #2 (tiling)" count only when the number comes first
    ids += [int(m.group(1)) for _, rest in _labelled(lines, r"(?:selected |chosen )?idea")
            if (m := re.match(r"[\s#\[(]*(\d+)\b", rest))]
    exps = _labelled(lines, r"experiment description|experiment|hypothesis")
    stop = r"^(idea id|experiment|code|implementation|program)\b"
    idea_id = next((i for i in ids if i is not None), None)
    if idea_id is None:  # "Idea ID" header with the number on the next line
        for k, line in enumerate(lines):
            if re.fullmatch(r"(selected\s+)?idea\s*id", line, re.I) and k + 1 < len(lines):
                idea_id = _first_int(lines[k + 1])
                break
    experiment = _paragraph(lines, exps[0][0], exps[0][1], stop) if exps else ""
    if idea_id is None and not experiment:
        return None
    return Selection(idea_id, experiment, extract_code(text))


def parse_drop_list(text: str) -> list[int] | None:
    """Returns the idea ids of a "Dropping Ideas: [..]" reply ([] is a valid answer), or None."""
    lines = _plain_lines(text)
    for _, rest in _labelled(lines, r"dropping ideas|drop(?:ped)? ideas|ideas to drop|drop"):
        found = re.search(r"\[([^\]]*)\]", rest)
        if found:
            return [int(x) for x in re.findall(r"\d+", found.group(1))]
        if re.match(r"(none|nothing)\b", rest, re.I):
            return []
        if numbers := re.findall(r"\d+", rest):   # "Dropping Ideas: 2, 4" or "Idea 2 and Idea 4"
            return [int(x) for x in numbers]
    lists = re.findall(r"\[([\d\s,#]*)\]", "\n".join(lines))
    return [int(x) for x in re.findall(r"\d+", lists[-1])] if lists else None


def parse_duplicate_verdict(text: str) -> tuple[bool, int | None] | None:
    """Returns (is_repeat, logged entry number or None), or None when there is no verdict."""
    lines = _plain_lines(text)
    verdict = _labelled(lines, r"repeat|duplicate|is repeat")
    if not verdict:
        return None
    word = verdict[0][1].lower()
    if not word.startswith(("yes", "no", "true", "false")):
        return None
    entry = _labelled(lines, r"entry|logged entry")
    return word.startswith(("yes", "true")), (_first_int(entry[0][1]) if entry else None)


def parse_summary(text: str) -> str | None:
    """Returns the key findings of a summary reply, or None."""
    lines = _plain_lines(text)
    found = _labelled(lines, r"key findings|results|summary")
    if found:
        k, rest = found[0]
        body = " ".join(" ".join([rest] + [ln for ln in lines[k + 1:] if ln]).split())
        return body[:800] or None
    return None


# ----------------------------------------------------------------------------------------------------
# Rendering (compact, bounded prompts).

def _short(text: str, limit: int = 160) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def render_pool(pool: IdeaPool, records_shown: int = 3) -> str:
    """Returns the idea repository as prompt text: per idea its best result, key findings and last records."""
    if not pool.ideas:
        return "(empty: no ideas yet)"
    out = []
    for idea in pool.ideas:
        best = idea.best_metric or "no successful experiment yet"
        out.append(f"Idea ID: {idea.id} | experiments: {idea.tried} | best: {best}")
        out.append(f"  Description: {idea.description}")
        if idea.summary:
            out.append(f"  Key findings: {idea.summary}")
        hidden = len(idea.hypotheses) - records_shown
        if hidden > 0:
            out.append(f"  ({hidden} earlier records not shown)")
        for h in idea.hypotheses[-records_shown:] if records_shown > 0 else []:
            out.append(f"  - [{h.status}] {_short(h.experiment)} -> {_short(h.result, 200)}")
    return "\n".join(out)


def render_dropped(log: GlobalLog, limit: int = 10) -> str:
    if not log.pruned:
        return ""
    lines = ["", "Dropped ideas (do not propose them again without a new angle):"]
    for idea in log.pruned[-limit:]:
        extra = f"; findings: {_short(idea.summary, 200)}" if idea.summary else ""
        lines.append(f"- {_short(idea.description, 200)} (best: {idea.best_metric or 'none'}{extra})")
    return "\n".join(lines) + "\n"


def render_log(log: GlobalLog, limit: int = 80) -> str:
    first = max(0, len(log.tried) - limit)
    lines = [f"({first} older entries not shown)"] if first else []
    for n, e in enumerate(log.tried[first:], start=first + 1):
        h = e.hypothesis
        lines.append(f"#{n} [idea {e.idea_id}: {_short(e.idea, 80)}] {_short(h.experiment, 200)} -> {_short(h.result, 120)}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------
# One generation of Algorithm 1.

LLM = Callable[[str], str]


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

    def ask(self, prompt: str, parse: Callable[[str], tuple[object, str]], cheap: bool = False) -> _Reply:
        fn = self.cheap_llm if cheap and self.cheap_llm is not None else self.llm
        reason = ""
        for attempt in range(1 + self.retries):
            if fn is self.llm:
                self.strong += 1
            else:
                self.cheap += 1
            try:
                text = fn(prompt if attempt == 0 else prompt + REMINDER.format(reason=reason))
            except Exception as exc:  # any client failure is a recorded failure, never a crash
                msg = f"LLM call failed ({prompt_kind(prompt)}): {type(exc).__name__}: {_short(exc, 300)}"
                self.events.append(msg)
                return _Reply(reason=msg, llm_error=True)
            text = text if isinstance(text, str) else ""
            value, reason = parse(text)
            if value is not None:
                return _Reply(value=value, text=text)
            self.events.append(f"unusable {prompt_kind(prompt)} reply: {reason}")
        return _Reply(reason=reason, text=text)


def _record(log: GlobalLog, idea: Idea | None, hyp: Hypothesis) -> None:
    """Alg. 1 lines 14-15: the record goes on the idea and into the permanent log (failures too)."""
    if idea is not None:
        idea.hypotheses.append(hyp)
        idea.tried += 1
        if hyp.status == "ok" and hyp.score is not None and (idea.best_score is None or hyp.score < idea.best_score):
            idea.best_score, idea.best_metric = hyp.score, hyp.metric
    log.tried.append(LogEntry(idea.id if idea else None, idea.description if idea else "", hyp))


def _generate_ideas(pool, log, task, parent, cfg, caller, events) -> bool:
    """Alg. 1 lines 2-10. Returns False when P is still empty (nothing to select from)."""
    novelty = (" At least one idea must lie outside every existing idea."
               if len(pool.ideas) <= cfg.k_idea else "")
    prompt = IDEA_GEN_PROMPT.format(task=task.name, background=task.background, parent_metric=parent.metric,
                                    direction=task.direction, parent_source=parent.source.strip(),
                                    pool=render_pool(pool, cfg.records_shown), dropped=render_dropped(log),
                                    n=cfg.n_proposals, novelty=novelty)
    reply = caller.ask(prompt, lambda t: (parse_ideas(t) or None, "no 'Idea: ...' entries found"))
    proposals = (reply.value or [])[:cfg.n_proposals]   # Proposals <- LLM_idea_gen(P)
    for proposal in proposals:                           # line 3
        if not pool.ideas:                               # nothing to merge into: no classification call
            events.append(f"new idea {pool.add(proposal).id}: {_short(proposal, 100)}")
            continue
        ids = pool.ids()

        def check(text: str) -> tuple[Classification | None, str]:
            c = parse_classification(text)
            if c is None:
                return None, "no 'Idea Exists: True/False' answer in the required format"
            if c.exists and c.idea_id not in ids:
                return None, f"Idea ID {c.idea_id} is not in the repository (valid ids: {ids})"
            return c, ""

        prompt = CLASSIFY_PROMPT.format(task=task.name, pool=render_pool(pool, 0), proposal=proposal)
        c = caller.ask(prompt, check, cheap=True).value  # line 4: ID <- LLM_idea_classification(idea, P)
        if c is not None and c.exists:                   # lines 5-6: refine P_ID
            idea = pool.get(c.idea_id)
            idea.description = c.description or idea.description
            events.append(f"merged proposal into idea {idea.id}: {_short(proposal, 100)}")
        else:                                            # lines 7-8: P <- P ∪ {idea}
            desc = c.description if c is not None else proposal
            note = "" if c is not None else " (classification failed: kept as new)"
            events.append(f"new idea {pool.add(desc).id}{note}: {_short(desc, 100)}")
    return bool(pool.ideas)


def _select(pool, log, task, parent, cfg, caller, events, note: str) -> tuple[_Reply, Selection | None]:
    """Alg. 1 line 11: I_sel, H_new <- LLM_select(P), with the program. Returns the reply and the last
    parsed selection (possibly invalid, for the fallbacks)."""
    ids = pool.ids()
    prompt = SELECT_PROMPT.format(task=task.name, background=task.background, parent_metric=parent.metric,
                                  direction=task.direction, parent_source=parent.source.strip(),
                                  pool=render_pool(pool, cfg.records_shown), dropped=render_dropped(log),
                                  note=note, valid_ids=", ".join(map(str, ids)))

    def check(text: str) -> tuple[Selection | None, str]:
        s = parse_selection(text)
        if s is None or s.idea_id is None:
            return None, "no 'Idea ID: <id>' line"
        if s.idea_id not in ids:
            return None, f"Idea ID {s.idea_id} is not in the repository (valid ids: {ids})"
        if s.code is None:
            return None, code_problem(text)
        return s, ""

    reply = caller.ask(prompt, check)
    return reply, (reply.value if reply.value is not None else parse_selection(reply.text))


def _is_repeat(log, task, idea, experiment, cfg, caller, events) -> str:
    """Returns a description of the logged experiment that H_new repeats, or "" (Alg. 1 line 12).
    An empty log or an exact text match costs no LLM call."""
    key = " ".join(experiment.lower().split())
    if not key:                  # nothing stated, nothing to compare
        return ""
    for n, e in enumerate(log.tried, start=1):
        if e.hypothesis.attempts and " ".join(e.hypothesis.experiment.lower().split()) == key:
            return f"#{n}: {_short(e.hypothesis.experiment, 120)}"
    if not any(e.hypothesis.attempts for e in log.tried):   # nothing was ever executed: no call
        return ""
    prompt = DUPLICATE_PROMPT.format(task=task.name, log=render_log(log, cfg.max_log_lines),
                                     idea_id=idea.id, idea=idea.description, experiment=experiment)
    reply = caller.ask(prompt, lambda t: (parse_duplicate_verdict(t), "no 'Repeat: yes/no' line"), cheap=True)
    if reply.value is None or not reply.value[0]:
        return ""
    n = reply.value[1]
    entry = log.tried[n - 1].hypothesis.experiment if n and 1 <= n <= len(log.tried) else "unspecified entry"
    return f"#{n}: {_short(entry, 120)}" if n else entry


def _execute(execute, program: str) -> Outcome:
    try:
        out = execute(program)
    except Exception as exc:  # the caller's evaluator broke: a recorded failure, not a crash
        return Outcome("execute_error", message=f"{type(exc).__name__}: {_short(exc, 300)}")
    return out if isinstance(out, Outcome) else Outcome("execute_error", message=f"execute returned {type(out).__name__}")


def _one_liner(outcome: Outcome) -> str:
    if outcome.status == "ok":
        return outcome.metric or f"score {outcome.score}"
    return f"{outcome.status}: {_short(outcome.message or 'no message', 140)}"


def _evaluate_with_repairs(program, parent, log, task, idea, experiment, cfg, caller, execute, events, result):
    """Alg. 1 line 13 plus the repair loop. Returns (final program, final Outcome)."""
    parent_hash = program_hash(parent.source)
    while True:
        pid = program_id(program)
        outcome = _execute(execute, program)          # line 13: Result <- Execute(H_new)
        result.attempts.append({"program_id": pid, **outcome.to_dict()})
        if outcome.status != "execute_error":
            log.program_hashes.add(program_hash(program))
        repairs = len(result.attempts) - 1
        if outcome.status in ("ok", "execute_error") or repairs >= cfg.max_repairs:
            return program, outcome
        prompt = REPAIR_PROMPT.format(task=task.name, background=task.background, idea_id=idea.id,
                                      idea=idea.description, experiment=experiment, status=outcome.status,
                                      program=program.strip(), message=outcome.message or "(no message)")
        reply = caller.ask(prompt, lambda t: (extract_code(t), code_problem(t)))
        if reply.value is None:
            events.append(f"repair {repairs + 1} gave no program: {reply.reason}")
            return program, outcome
        h = program_hash(reply.value)
        if h in log.program_hashes or h == parent_hash:
            events.append(f"repair {repairs + 1} returned an already evaluated program; stopping repairs")
            return program, outcome
        events.append(f"repair {repairs + 1} after {outcome.status}")
        program = reply.value


def _summarise(idea, task, cfg, caller, events) -> None:
    """Alg. 1 lines 17-20: I_sel.history <- {Summary}. The best result is always kept verbatim."""
    records = "\n".join(f"- [{h.status}] {_short(h.experiment, 200)} -> {_short(h.result, 160)}"
                        for h in idea.hypotheses)
    prompt = SUMMARY_PROMPT.format(task=task.name, direction=task.direction, idea_id=idea.id,
                                   idea=idea.description, summary=idea.summary or "(none)", records=records)
    reply = caller.ask(prompt, lambda t: (parse_summary(t), "no 'Key findings:' line"), cheap=True)
    ok = sum(h.status == "ok" for h in idea.hypotheses)
    text = reply.value or (f"{idea.summary} " if idea.summary else "") + \
        f"{len(idea.hypotheses)} more experiments, {ok} successful (summary call failed)."
    best = f"Best: {idea.best_metric}. " if idea.best_metric and idea.best_metric not in text else ""
    events.append(f"summarised idea {idea.id} ({idea.history_size()} history entries > K_hyp={cfg.k_hyp})")
    idea.summary, idea.hypotheses = _short(best + text, 900), []


def _weakest_first(ideas: list[Idea]) -> list[Idea]:
    """Ideas ordered for deterministic pruning: no success first, then worst best score, then oldest."""
    return sorted(ideas, key=lambda i: (i.best_score is not None, -(i.best_score or 0.0), i.id))


def _prune(pool, log, task, cfg, caller, events) -> None:
    """Alg. 1 lines 21-24: drop exactly |P| - K_idea ideas, chosen by the LLM; pruned ideas go to L."""
    n_drop = len(pool.ideas) - cfg.k_idea
    ids = pool.ids()
    prompt = PRUNE_PROMPT.format(task=task.name, direction=task.direction, pool=render_pool(pool, cfg.records_shown),
                                 cap=cfg.k_idea, n_drop=n_drop)
    reply = caller.ask(prompt, lambda t: (parse_drop_list(t), "no 'Dropping Ideas: [ids]' list"), cheap=True)
    named = list(dict.fromkeys(reply.value or []))
    invalid = [i for i in named if i not in ids]
    chosen = [i for i in named if i in ids][:n_drop]
    if invalid:
        events.append(f"prune: ignored ids not in the pool: {invalid}")
    if len([i for i in named if i in ids]) > n_drop:
        events.append(f"prune: LLM named more than {n_drop}; dropping the first {n_drop} named")
    if len(chosen) < n_drop:
        extra = [i.id for i in _weakest_first(pool.ideas) if i.id not in chosen][:n_drop - len(chosen)]
        events.append(f"prune: LLM named {len(chosen)} of {n_drop}; also dropping weakest/oldest {extra}")
        chosen += extra
    for idea in [i for i in pool.ideas if i.id in chosen]:
        pool.ideas.remove(idea)
        log.pruned.append(idea)
    events.append(f"pruned ideas {sorted(chosen)} (|P| > K_idea={cfg.k_idea})")


def prune_pool(pool: IdeaPool, log: GlobalLog, *, llm: LLM, config: HCMConfig = HCMConfig(),
               task: TaskContext | None = None) -> list[str]:
    """Returns notes on what was pruned; applies Alg. 1 lines 21-24 outside a generation (e.g. after
    a crossover merged another island's ideas in). No LLM call when |P| <= K_idea."""
    events: list[str] = []
    if len(pool.ideas) > config.k_idea:
        task = task or TaskContext("the task", "")
        _prune(pool, log, task, config, _Caller(llm, None, config.max_format_retries, events), events)
    return events


def merge_pools(dst: IdeaPool, src: IdeaPool) -> list[int]:
    """Returns the new ids of the ideas copied from `src` into `dst` (crossover, paper §3.3): each idea
    keeps its records, summary and best result and gets a fresh id in `dst`; ideas whose description
    `dst` already holds (ignoring case and spacing) are skipped. Call prune_pool afterwards."""
    known = {" ".join(i.description.lower().split()) for i in dst.ideas}
    added = []
    for idea in src.ideas:
        key = " ".join(idea.description.lower().split())
        if key in known:
            continue
        copy = Idea.from_dict(idea.to_dict())
        copy.id, dst.next_id = dst.next_id, dst.next_id + 1
        dst.ideas.append(copy)
        known.add(key)
        added.append(copy.id)
    return added


def run_generation(pool: IdeaPool, log: GlobalLog, *, task: TaskContext, parent: Parent, llm: LLM,
                   execute: Callable[[str], Outcome], config: HCMConfig = HCMConfig(),
                   cheap_llm: LLM | None = None, rng: random.Random | None = None) -> GenerationResult:
    """Returns the result of one generation of Algorithm 1; mutates `pool` (P) and `log` (L) in place.
    `llm` does generation, selection and repairs; `cheap_llm` (default: llm) classification, the
    duplicate check, summaries and pruning. `rng` is accepted for interface stability: HCM makes no
    random draws (every choice is the LLM's or deterministic), so runs are reproducible."""
    cfg = config
    result = GenerationResult(status="no_ideas", parent_id=parent.program_id)
    events = result.events
    caller = _Caller(llm, cheap_llm, cfg.max_format_retries, events)
    try:
        _run(pool, log, task, parent, cfg, caller, execute, result)
    finally:
        result.strong_calls, result.cheap_calls = caller.strong, caller.cheap
    return result


def _run(pool, log, task, parent, cfg, caller, execute, result) -> None:
    events = result.events
    if not _generate_ideas(pool, log, task, parent, cfg, caller, events):      # lines 2-10
        result.status = "llm_error" if any("LLM call failed" in e for e in events) else "no_ideas"
        return
    note, parent_hash = "", program_hash(parent.source)
    for round_ in range(1 + cfg.max_duplicate_retries):
        reply, sel = _select(pool, log, task, parent, cfg, caller, result.events, note)   # line 11
        if reply.llm_error and sel is None:
            result.status = "llm_error"
            break
        idea = pool.get(sel.idea_id) if sel else None                   # I_sel
        if sel is not None and idea is None and sel.experiment and sel.code:
            # a hallucinated id, even after the reminder: the experiment becomes a new idea of its own,
            # so its result is not attributed to an unrelated idea
            idea = pool.add(sel.experiment)
            events.append(f"missing or unknown idea id {sel.idea_id}; recorded under new idea {idea.id}")
        experiment = (sel.experiment if sel else "") or "(experiment not described)"  # H_new
        result.idea_id, result.experiment = (idea.id if idea else None), experiment
        if sel is None or idea is None or sel.code is None:
            status = "no_program" if idea is not None else "no_selection"
            result.status = status
            _record(log, idea, Hypothesis(experiment, status=status,
                                          result=f"{status}: {_short(reply.reason, 160)}"))
            break
        result.program, result.program_id = sel.code, program_id(sel.code)
        h = program_hash(sel.code)
        if h in log.program_hashes or h == parent_hash:                 # line 12, exact program: free
            result.status = "duplicate_program"
            what = "the parent program" if h == parent_hash else "an already evaluated program"
            _record(log, idea, Hypothesis(experiment, result.program_id, "duplicate_program",
                                          result=f"not evaluated: identical to {what}"))
            break
        repeat = _is_repeat(log, task, idea, sel.experiment, cfg, caller, events)   # line 12, H_new ∈ L?
        if repeat and round_ < cfg.max_duplicate_retries:
            events.append(f"experiment repeats logged {repeat}; asking for a different one")
            note = DUPLICATE_NOTE.format(what=f"'{_short(experiment, 160)}' repeats {repeat}")
            continue
        if repeat:
            result.status = "duplicate_experiment"
            _record(log, idea, Hypothesis(experiment, result.program_id, "duplicate_experiment",
                                          result=f"not evaluated: repeats logged {repeat}"))
            break
        program, outcome = _evaluate_with_repairs(sel.code, parent, log, task, idea, experiment, cfg,
                                                  caller, execute, events, result)
        result.program, result.program_id, result.outcome = program, program_id(program), outcome
        result.status = "execute_error" if outcome.status == "execute_error" else "evaluated"
        lines = [f"{a['program_id']}: {_one_liner(Outcome.from_dict(a))}" for a in result.attempts]
        one = _one_liner(outcome) + (f" (after {len(lines) - 1} repair(s))" if len(lines) > 1 else "")
        _record(log, idea, Hypothesis(experiment, result.program_id, outcome.status, outcome.score,
                                      outcome.metric, one, lines))                 # lines 14-15
        break
    idea = pool.get(result.idea_id)
    if idea is not None and idea.history_size() > cfg.k_hyp:                      # line 17
        _summarise(idea, task, cfg, caller, events)                                # lines 18-19
    if len(pool.ideas) > cfg.k_idea:                                               # line 21
        _prune(pool, log, task, cfg, caller, events)                               # lines 22-23

"""Parsers of HCM replies (PACEvolve App. B.2.3 answer formats): they accept what LLMs really write
(bold, headers, numbering, prose around the answer, CRLF, several code blocks, ~~~ fences) and return
None, never raise, when a reply holds no answer.

    parse_ideas            "Idea: ..." entries of an idea-generation reply
    parse_choice           the idea chosen in that same reply ("Choice: proposal 2" / "Choice: idea 4")
                           and its experiment
    parse_classifications  one classification per proposal of a batched classification reply
    parse_selection        idea id, experiment (and a program, when there is one) of a selection reply
    extract_code           the candidate program: the last complete fenced block defining ModelNew
    parse_implemented      the implementer's own words on what its program does ("Implemented: ...")
    parse_duplicate_verdict, parse_summary, parse_drop_list
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from hcm_state import clip, parse_python

SUMMARY_CHARS = 800       # key findings kept per summary (the prompt asks for four sentences)
IMPLEMENTED_CHARS = 400   # the implementer's description kept per record (the prompt asks for two sentences)

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
        tree = parse_python(code)
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
                parse_python(code)
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
class Choice:
    """The idea picked at the end of an idea-generation reply: one of its own proposals (1-based) or an
    idea already in the repository, with the experiment that tests it."""
    proposal: int | None
    idea_id: int | None
    experiment: str


def parse_choice(text: str) -> Choice | None:
    """Returns the "Choice: proposal k | idea N" and "Experiment: ..." of an idea-generation reply, or
    None when either is missing."""
    lines = _plain_lines(text)
    picks = _labelled(lines, r"choice|chosen|selected|selection")
    exps = _labelled(lines, r"experiment description|experiment")
    if not picks or not exps:
        return None
    rest = picks[0][1]
    experiment = _paragraph(lines, exps[0][0], exps[0][1], r"^(choice|experiment|idea|reasoning)\b")
    if m := re.search(r"proposal\s*#?\s*(\d+)", rest, re.I):
        return Choice(int(m.group(1)), None, experiment) if experiment else None
    if m := re.search(r"(?:idea\s*(?:id)?\s*)?#?\s*(\d+)", rest, re.I):
        return Choice(None, int(m.group(1)), experiment) if experiment else None
    return None


def parse_classifications(text: str, n: int) -> dict[int, Classification]:
    """Returns the classifications of a batched reply, keyed by proposal number (1..n); proposals whose
    section is missing or unusable are absent. Sections start at "Proposal k" lines; a reply for a
    single proposal may omit the header."""
    lines = _plain_lines(text)
    header = re.compile(r"^proposal\s*#?\s*(\d+)\b\s*[:.)–—-]?\s*(.*)$", re.I)
    starts = [(k, int(m.group(1))) for k, line in enumerate(lines) if (m := header.match(line))]
    sections = {num: "\n".join(lines[k + 1:(starts[i + 1][0] if i + 1 < len(starts) else len(lines))])
                for i, (k, num) in enumerate(starts)}
    if not starts and n == 1:
        sections = {1: "\n".join(lines)}
    out = {}
    for num, body in sections.items():
        if 1 <= num <= n and num not in out and (c := parse_classification(body)) is not None:
            out[num] = c
    return out


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
        return clip(body, SUMMARY_CHARS) or None
    return None


def parse_implemented(text: str) -> str:
    """Returns what the implementer says its program does: the "Implemented: ..." paragraph outside
    the code, else the prose outside the code blocks; "" when there is none. Long text is clipped, with
    a mark."""
    lines = _plain_lines(text)
    found = _labelled(lines, r"implemented|implementation|what (?:the|this) (?:code|program) does|built")
    if found:
        body = _paragraph(lines, found[0][0], found[0][1], r"^(cause|experiment|idea|reasoning)\b")
    else:
        body = " ".join(ln for ln in lines if ln)
    return clip(body, IMPLEMENTED_CHARS)


# ----------------------------------------------------------------------------------------------------

"""What a run prints while it runs: one line per generation that explains itself, as pure functions.

    generation_result(gen, score, s0)   # "1.22x (4.091 ms)", "incorrect (output 0 at [1, 2]: got 2.7, ...)"
    failure_reason(status, message)     # the evaluator's message cut to the few words that say why
    final_lines(why, cause, best, ...)  # "done: ..." or "stopped: ...", and the fix for a stop
    spend_note(spend, cost, several)    # "  by cheap 2, strong 1  $0.42 of $5"

A failed candidate's line carries its reason (the first differing output, the error and its line, the rule
broken); a candidate that needed repairs says so and what was repaired; LLM failures name their classes.
"""
from __future__ import annotations

import re

from driver import models

REASON_CHARS = 110


def generation_result(gen, score: float | None, s0: float, llm_failures: list[str], shown: str | None = None) -> str:
    """The result part of a generation's progress line. `gen` is an hcm.GenerationResult, `score` the
    run's score of its last candidate (None when it has none), `llm_failures` the classes of the LLM calls
    that failed during it, `shown` the scored candidate's measured figures as the search words them
    (ranking.describe: both times, the speedup and its noise band)."""
    if gen.status == "llm_error" and llm_failures:
        return f"llm_error ({', '.join(sorted(set(llm_failures)))})"
    outcome = gen.outcome
    if score is not None:
        text = shown or f"{s0 / score:.2f}x ({score:.4g} ms)"
    elif outcome is None:
        text = gen.status   # no candidate: no_program, duplicate_program, llm_error, ...
    elif outcome.status == "ok":   # the evaluator said ok, but its runtime is no number to rank by
        text = "ok, not scored (no finite runtime)"
    elif outcome.status == "execute_error":
        text = f"no verdict: the evaluator failed ({failure_reason('', outcome.message)})"
    else:
        reason = failure_reason(outcome.status, outcome.message)
        text = outcome.status + (f" ({reason})" if reason and reason != outcome.status else "")
    repaired = [a["status"] for a in gen.attempts[:-1]]
    if repaired:
        text += (f" after {len(repaired)} repair{'s' * (len(repaired) > 1)}"
                 + (f" of {', '.join(dict.fromkeys(repaired))}" if score is not None else ""))
    if llm_failures:
        n = len(llm_failures)
        text += f" [{n} LLM call{'s' * (n > 1)} failed: {', '.join(sorted(set(llm_failures)))}]"
    return text


def final_lines(why: str, cause: str, best: dict | None, s0: float, path, report,
                shown: str | None = None) -> tuple[str, str]:
    """The last line on stdout ("done: ..." or "stopped: ..." with the best and the reports) and, for a run
    stopped by `cause` ("llm" or "evaluator"; "" when it ended normally), the fix on stderr ("" if none).
    `shown`: the best's measured figures as the search words them (ranking.describe)."""
    if best is None:
        found = "No correct candidate. "
    else:
        figures = shown or f"{best['speedup']:.3f}x ({best['runtime_ms']:.4g} ms)"
        found = (f"Best {figures} in {path / 'best.py'}. " if best["runtime_ms"] < s0 else
                 f"No candidate beat the reference; the fastest correct one ({figures}, slower) is in "
                 f"{path / 'best.py'}. ")
    done = f"{'stopped' if cause else 'done'}: {why}. {found}Report: {report}, {path / 'report.html'}"
    if cause == "llm":
        return done, (f"run.py: stopped: {why}. Fix the LLM set-up, then continue with: python run.py --resume "
                      f"{path} (--model, --base-url, --provider may change)")
    if cause == "evaluator":
        return done, (f"run.py: stopped: {why}. Fix the evaluator's set-up (device, cluster), then continue "
                      f"with: python run.py --resume {path}")
    return done, ""


def spend_note(spend, cost: dict, several: bool) -> str:
    """The progress line's tail: with several main models, those the generation called (and how often when
    more than one); the dollars spent so far when a model costs money or --budget-usd is set."""
    out = ""
    calls = cost.get("models") or {}
    if several and calls:
        out += "  by " + ", ".join(m + (f" {n}" if len(calls) > 1 else "") for m, n in calls.items())
    if spend is not None and (spend.priced or spend.cap):
        out += f"  {models.usd(spend.total)}" + (f" of {models.usd(spend.cap)}" if spend.cap else "")
    return out


def failure_reason(status: str, message: str, limit: int = REASON_CHARS) -> str:
    """A few words of the evaluator's `message` saying why the candidate failed."""
    text = " ".join((message or "").split())
    wrong = re.search(r"\b(output \d+)\b.*?\bindex (\[[^\]]*\]): got ([^,;()]+), expected ([^\s,;()]+)", text)
    if status == "incorrect" and wrong:
        return _cut(f"{wrong[1]} at {wrong[2]}: got {wrong[3].strip()}, expected {wrong[4]}", limit)
    text = re.sub(r"\s*\[candidate line (\d+)[^\]]*\]", r" (line \1)", text)   # the code itself is too long
    text = re.sub(r"^(rejected|incorrect|ok)(:\s*|\s+by\s+|\s+(?=on ))", "", text)   # the status is shown already
    text = re.sub(r"^on (trial \d+) \([^)]*\):", r"\1:", text)
    text = re.sub(r"^(forward|__init__|build|run): ", "", text)
    text = re.sub(r"(\bat line \d+):.*", r"\1", text)   # a rule's line number, not the line again
    text = re.sub(r"\. Log tail:.*", "", text)
    return _cut(text, limit)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 3].rstrip() + "..."

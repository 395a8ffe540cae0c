"""The transcript of a run: every LLM exchange, kept in the run directory as transcript.jsonl.

The paper's mechanisms (§3.1 Algorithm 1, §3.3) live in what the LLM is asked and answers; the transcript
keeps all of it, so a reader can watch Algorithm 1 at work and `run.py --replay` (driver/replay.py) can run the
same search again without an API.

    book = Transcript()                              # records made before the run directory exists wait
    llm = book.recorder(call, client, role="main", island=0, generation=3)
    llm(prompt, purpose="selection", attempt=0)      # hcm._Caller passes both; see Recorder
    book.attach(run_dir)                             # writes what waited, then every record as it is made
    calls = read(run_dir)                            # the call records; text(call["reply"]) is the reply
    python -m driver.transcript RUN_DIR [N ...]             # prints calls N (default: a line per call)

One JSON object per line, two kinds:
  {"text": ID, "body": "..."}    a piece of text, stored once; ID is its sha256 (16 hex digits)
  {"call": N, ...}               one LLM request: time, stage ("setup" for the probe, "generation", or
      "crossover" for the prune after a crossover), island, generation, purpose (the HCM prompt kind:
      idea_generation, classification, selection, duplicate_check, implementation, repair, summary, prune;
      "probe"), attempt (1 for a format reminder), role (main or secondary), model, messages (the chat
      messages sent), reply (None when the call failed), error ("Class: message"), program (the id of
      the program an implementation or repair reply carries), tokens, latency_s, retries, finish, usd
      (its US dollars at the run's prices, driver/models.py; None when the model has no price).
  A text field is a string, or a list of strings and {"t": ID} references, joined in order (`text`).
Never kept: API keys (not even one a reply or a prompt holds: llm.Client.redact), headers, URLs. A request the client never sent (llm_check.LLMStopped after too many
failures) is not a record; a call that failed after reaching the client is, with its error.

Bounded in size: texts are cut after blank lines, and every piece of PIECE or more characters is stored once
and referenced after; a run's prompts repeat the background, the reference and the parent programs, so the
file grows by little more than what is new in each exchange. Lines are appended under a lock; a kill
mid-write leaves at most a partial last line, which readers skip and `attach` drops. `rewind(n)` drops
what a resumed run will ask again (the lines after its checkpoint), as run.py does with events.jsonl.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import threading
import time
from pathlib import Path

from hcm_parsers import extract_code
from hcm_state import program_id

FILE = "transcript.jsonl"
PIECE = 80                           # characters from which a piece of text is stored once
CODE_PURPOSES = ("implementation", "repair")


class Transcript:
    """The run's transcript file, shared by every island's recorder (thread-safe)."""

    def __init__(self):
        self.path: Path | None = None
        self.lines = 0                 # lines in the file; checkpoints keep it, a resume rewinds to it
        self.calls = 0                 # the last call number used
        self._session_start = 0        # lines in the file when this process attached
        self._known: set[str] = set()  # text ids in the file
        self._waiting: list[dict] = []
        self.failed = False
        self._lock = threading.Lock()

    def recorder(self, call, client=None, *, role: str, island: int | None = None,
                 generation: int | None = None, stage: str = "generation", purpose: str | None = None):
        """The LLM as HCM should call it: `call(prompt)` (a client, or a client wrapped by llm_check),
        recorded. `client` is the client itself, read for the model, tokens and retries of each call."""
        return Recorder(self, call, client if client is not None else call, role=role, island=island,
                        generation=generation, stage=stage, purpose=purpose)

    def attach(self, run_dir: Path) -> None:
        """Write into run_dir/transcript.jsonl from now on: what is there stays (a resumed run), a partial
        last line is dropped, and the records made before (the probes) are written first."""
        path = Path(run_dir) / FILE
        with self._lock:
            lines = _complete_lines(path)
            if path.exists():
                _rewrite(path, lines)
            self.path, self.lines, self._session_start = path, len(lines), len(lines)
            self._known, self.calls = _scan(lines)
            waiting, self._waiting = self._waiting, []
            for record in waiting:
                self._write(record)

    def rewind(self, lines: int | None) -> None:
        """A resumed run: drop the calls after the checkpoint's `lines` (they will be made again), keeping
        this session's own records (the probes) and every stored text."""
        if lines is None or self.path is None:
            return
        with self._lock:
            old = _complete_lines(self.path)
            if lines >= self._session_start:
                return
            kept = (old[:lines] + [x for x in old[lines:self._session_start] if x.startswith('{"text"')]
                    + old[self._session_start:])
            _rewrite(self.path, kept)
            self.lines, self._session_start = len(kept), len(kept) - (len(old) - self._session_start)

    def add(self, record: dict) -> None:
        """Store one call record (its texts as plain strings; they are split and stored once here). A file
        that cannot be written is said once and never stops the search."""
        with self._lock:
            if self.path is None:
                self._waiting.append(record)
                return
            try:
                self._write(record)
            except OSError as e:
                if not self.failed:
                    print(f"transcript: {self.path} not written: {e}", file=sys.stderr)
                self.failed = True

    def _write(self, record: dict) -> None:
        out: list[str] = []
        self.calls += 1
        record = {"call": self.calls, **record}
        record["messages"] = [{**m, "content": self._store(m["content"], out)} for m in record["messages"]]
        if record.get("reply") is not None:
            record["reply"] = self._store(record["reply"], out)
        out.append(json.dumps(record))
        with open(self.path, "a", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in out))
        self.lines += len(out)

    def _store(self, text: str, out: list[str]):
        pieces: list = []
        for part in _split(text):
            if len(part) < PIECE:
                if pieces and isinstance(pieces[-1], str):
                    pieces[-1] += part
                else:
                    pieces.append(part)
                continue
            tid = hashlib.sha256(part.encode("utf-8", "surrogatepass")).hexdigest()[:16]
            if tid not in self._known:
                self._known.add(tid)
                out.append(json.dumps({"text": tid, "body": part}))
            pieces.append({"t": tid})
        return pieces[0] if len(pieces) == 1 and isinstance(pieces[0], str) else pieces


class Recorder:
    """A callable LLM that records each call in the transcript. `takes_purpose` tells hcm._Caller to pass
    the prompt kind it asks with (purpose=) and whether this is a format reminder (attempt=); a caller
    that passes neither (llm_check.probe) gets the purpose given at construction. Other attributes
    (model, base_url, usage ...) are the client's."""

    takes_purpose = True

    def __init__(self, book: Transcript, call, client, *, role, island, generation, stage, purpose):
        self.book, self.call, self.client = book, call, client
        self.where = {"stage": stage, "island": island, "generation": generation}
        self.role, self.purpose = role, purpose

    def __call__(self, prompt: str, purpose: str | None = None, attempt: int = 0) -> str:
        started, t0 = time.time(), time.monotonic()
        try:
            reply = self.call(prompt)
        except Exception as err:
            if getattr(err, "request_sent", True):   # llm_check.LLMStopped: nothing was asked
                self._record(prompt, purpose, attempt, started, t0, None, err)
            raise
        self._record(prompt, purpose, attempt, started, t0, reply if isinstance(reply, str) else "", None)
        return reply

    def __getattr__(self, name):
        if name == "client":   # not set yet (copying, pickling): no recursion
            raise AttributeError(name)
        return getattr(self.client, name)

    def _record(self, prompt, purpose, attempt, started, t0, reply, err) -> None:
        purpose = purpose or self.purpose or "unlabelled"
        # the file may be shared: a key that reached a prompt or a reply is not written (llm.Client.redact);
        # the search itself got the reply whole
        scrub = getattr(self.client, "redact", None)
        if callable(scrub):
            prompt, reply = scrub(prompt), scrub(reply) if reply else reply
        last = getattr(self.client, "last", None)
        usage = getattr(last, "usage", None) or {}
        record = {"time": round(started, 3), **self.where, "purpose": purpose, "attempt": attempt,
                  "role": self.role, "model": getattr(self.client, "model", None),
                  "messages": [{"role": "user", "content": prompt}], "reply": reply,
                  "error": f"{type(err).__name__}: {err}" if err is not None else None,
                  "program": None,
                  "tokens": {k: int(usage.get(k) or 0) for k in ("input", "output", "reasoning")} if usage else None,
                  "latency_s": round(time.monotonic() - t0, 3),
                  "retries": int(getattr(self.client, "last_retries", 0) or 0),
                  "finish": getattr(last, "finish", None), "usd": getattr(self.client, "last_usd", None)}
        if reply and purpose in CODE_PURPOSES:
            code = extract_code(reply)
            record["program"] = program_id(code) if code else None
        self.book.add(record)


# ----------------------------------------------------------------------------- reading

class Reading:
    """A transcript read back: `calls` in file order, `text(field)` to resolve a text field."""

    def __init__(self, texts: dict[str, str], calls: list[dict]):
        self.texts, self.calls = texts, calls

    def text(self, value) -> str:
        if value is None:
            return ""
        if isinstance(value, str):
            return value
        return "".join(p if isinstance(p, str) else self.texts.get(p.get("t"), "[missing text]") for p in value)

    def length(self, value) -> int:
        """len(self.text(value)), without joining the text."""
        if value is None or isinstance(value, str):
            return len(value or "")
        return sum(len(p) if isinstance(p, str) else len(self.texts.get(p.get("t"), "")) for p in value)

    def prompt(self, call: dict) -> str:
        return "\n\n".join(self.text(m.get("content")) for m in call.get("messages") or [])


def read(run_dir: Path) -> Reading:
    """Every complete line of run_dir/transcript.jsonl; none when there is no transcript."""
    texts: dict[str, str] = {}
    calls: list[dict] = []
    for line in _complete_lines(Path(run_dir) / FILE):
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if isinstance(d, dict) and isinstance(d.get("text"), str):
            texts[d["text"]] = d.get("body", "")
        elif isinstance(d, dict) and "call" in d:
            calls.append(d)
    return Reading(texts, calls)


def totals(reading: Reading) -> dict[str, dict]:
    """Per purpose: calls, failed calls, reminders, input and output tokens, latency (s), retries."""
    out: dict[str, dict] = {}
    for c in reading.calls:
        t = out.setdefault(str(c.get("purpose")), {"calls": 0, "failed": 0, "reminders": 0, "input": 0,
                                                    "output": 0, "latency_s": 0.0, "retries": 0})
        tokens = c.get("tokens") or {}
        t["calls"] += 1
        t["failed"] += c.get("error") is not None
        t["reminders"] += bool(c.get("attempt"))
        t["input"] += int(tokens.get("input") or 0)
        t["output"] += int(tokens.get("output") or 0)
        t["latency_s"] += float(c.get("latency_s") or 0.0)
        t["retries"] += int(c.get("retries") or 0)
    return out


# ----------------------------------------------------------------------------- helpers

def _split(text: str) -> list[str]:
    """`text` cut after each blank line (the pieces join back to it exactly)."""
    return [p for p in re.split(r"(?<=\n\n)", text) if p]


def _complete_lines(path: Path) -> list[str]:
    try:
        data = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    lines = data.split("\n")
    return lines[:-1]   # the last element is "" after a final newline, or a line cut short by a kill


def _rewrite(path: Path, lines: list[str]) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    os.replace(tmp, path)


def _scan(lines: list[str]) -> tuple[set[str], int]:
    """The text ids and the highest call number in `lines`."""
    known, calls = set(), 0
    for line in lines:
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if isinstance(d, dict) and isinstance(d.get("text"), str):
            known.add(d["text"])
        elif isinstance(d, dict) and isinstance(d.get("call"), int):
            calls = max(calls, d["call"])
    return known, calls


def main(argv: list[str] | None = None) -> int:
    """python -m driver.transcript RUN_DIR [N ...]: a line per call, or calls N ... with prompt and reply."""
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help") or not all(a.isdigit() for a in args[1:]):
        print("usage: python -m driver.transcript RUN_DIR [N ...]   (a line per LLM call, or calls N ... in full)")
        return 0 if args and args[0] in ("-h", "--help") else 2
    reading = read(Path(args[0]))
    if not reading.calls:
        print(f"transcript: no {FILE} with calls in {args[0]}", file=sys.stderr)
        return 2
    by_number = {c.get("call"): c for c in reading.calls}
    for c in reading.calls if len(args) == 1 else [by_number.get(int(n)) for n in args[1:]]:
        if c is None:
            print(f"transcript: no such call (1-{len(reading.calls)})", file=sys.stderr)
            return 2
        t = c.get("tokens") or {}
        head = (f"call {c.get('call')}: {c.get('purpose')}" + (" (format reminder)" if c.get("attempt") else "")
                + f", island {c.get('island')}, generation {c.get('generation')}, {c.get('role')} model "
                f"{c.get('model')}, {t.get('input', '?')} + {t.get('output', '?')} tokens, {c.get('latency_s')} s"
                + (f", ${c['usd']:.4g}" if c.get("usd") else "")
                + (f", failed: {c['error']}" if c.get("error") else "")
                + (f", wrote {c['program']}" if c.get("program") else ""))
        if len(args) == 1:
            print(head)
            continue
        print(f"=== {head}\n--- prompt\n{reading.prompt(c)}\n--- reply\n{reading.text(c.get('reply'))}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:   # | head
        sys.exit(0)

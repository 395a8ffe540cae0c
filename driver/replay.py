"""`run.py --replay RUN_DIR`: the search recorded in RUN_DIR again, every LLM reply taken from its transcript.

    recording = Recording.open(run_dir)            # ReplayError (one line) when it cannot be replayed
    cfg = recording.config(cfg, given)               # the recorded options; --out, --quiet may be given
    main, secondary = recording.clients()            # answer from the transcript: no key, no network
    evaluator = recording.evaluator(real, say)       # evaluates for real, hands the search the recording's result

A replay reproduces the recorded candidates exactly because everything its prompts and choices are made from
is the recording's: the task (the run's reference.py), seed and options; the device facts of the background
(kept in the checkpoint); s_0; and every evaluation result the search sees. A fresh measurement differs by
noise, and the prompts and the search's choices (tournaments, momentum, interventions) depend on it, so the
search gets the recorded result; each candidate is still evaluated for real on this machine, its verdict
compared with the recorded one (a difference is said at once, in one line) and both are kept
(details["replay"] in evals/). The replay's own transcript, report.html and report.md are written as in
any run.

Each island's calls are matched in order against that island's recorded calls (islands run at the same
time, but within an island the calls are sequential): the prompt must be the recorded one, character for
character, and the role (main or secondary) too. The first call that differs stops the replay with one
line naming the call and where its prompt differs (ReplayMismatch); so does a candidate the recording never
evaluated. A recorded LLM failure is raised again with its class and message; the probe calls are not
replayed (there is nothing to probe).
"""
from __future__ import annotations

import dataclasses
import json
import statistics
import threading
from pathlib import Path
from types import SimpleNamespace

from driver import rundir as rundir_mod
from driver import transcript
from driver.cli import REPLAY_OPTIONS, Config, _flag
from hcm_prompts import prompt_kind
from hcm_state import program_id
import llm


class ReplayError(Exception):
    """A directory that cannot be replayed; the message says why, in one line (a set-up error: exit 2)."""


class ReplayMismatch(BaseException):
    """The replay left its recording. A BaseException on purpose: HCM records an LLM exception as a failed
    call and goes on, and the evaluator's as a failed candidate; this must stop the run instead."""


class Recording:
    """A run directory read for replay: options, task, s_0, device facts, results, calls per island."""

    def __init__(self, path: Path, meta: dict, checkpoint: dict, reading: transcript.Reading,
                 results: dict[str, dict]):
        self.path, self.meta, self.checkpoint, self.reading, self.results = path, meta, checkpoint, reading, results
        self.s0 = checkpoint["baseline_ms"]
        self.facts = checkpoint["device_facts"]
        self.task, self.note = rundir_mod.RunDir.saved_task(SimpleNamespace(path=path), meta)
        self.queues: dict[int, list[dict]] = {}
        for c in reading.calls:
            if c.get("stage") != "setup" and isinstance(c.get("island"), int):
                self.queues.setdefault(c["island"], []).append(c)
        self.position = {i: 0 for i in self.queues}
        self.stopped = ""
        self._lock = threading.Lock()

    def probes(self) -> list[dict]:
        """The recording's set-up calls (the probes) as transcript records, their texts whole: a replay makes
        none, but its transcript, like its token counts, holds them as recorded."""
        out = []
        for c in self.reading.calls:
            if c.get("stage") == "setup":
                record = {k: v for k, v in c.items() if k != "call"}
                record["messages"] = [{**m, "content": self.reading.text(m.get("content"))}
                                      for m in c.get("messages") or []]
                record["reply"] = self.reading.text(c["reply"]) if c.get("reply") is not None else None
                record["recorded"] = True   # made by the recorded run, not by this replay
                out.append(record)
        return out

    @classmethod
    def open(cls, path: Path) -> "Recording":
        path = Path(path)
        where = f"--replay {path}"
        if not path.is_dir():
            raise ReplayError(f"{where}: no such directory")
        meta = _json(path / "config.json")
        checkpoint = _json(path / "checkpoint.json")
        if not isinstance(meta, dict) or not isinstance(meta.get("config"), dict) \
                or not isinstance(meta.get("task"), dict):
            raise ReplayError(f"{where}: no readable config.json with the task's settings, so this is not a "
                              "run directory that can be replayed")
        if not (path / transcript.FILE).is_file():
            raise ReplayError(f"{where}: no {transcript.FILE}: the run was made before LLM exchanges were kept, "
                              "so there is nothing to replay")
        if not isinstance(checkpoint, dict) or "device_facts" not in checkpoint:
            raise ReplayError(f"{where}: no checkpoint.json with the device facts its prompts were made from")
        reading = transcript.read(path)
        if not any(c.get("stage") != "setup" for c in reading.calls):
            raise ReplayError(f"{where}: its transcript holds no call of the search")
        try:
            return cls(path, meta, checkpoint, reading, _results(path, meta))
        except rundir_mod.RunDirError as e:
            raise ReplayError(f"{where}: {e}") from None

    def config(self, cfg: Config, given: set[str]) -> Config:
        """The recorded options, with the few a replay may set; generations stop where the recording did."""
        extra = sorted(given - set(REPLAY_OPTIONS))
        if extra:
            raise ReplayError(f"--replay runs with the recording's options, so {_flag(extra[0])} cannot be given "
                              f"(only {', '.join(_flag(o) for o in REPLAY_OPTIONS[1:])} can)")
        known = {f.name for f in dataclasses.fields(Config)}
        saved = {k: v for k, v in self.meta["config"].items() if k in known}
        merged = {**dataclasses.asdict(Config()), **saved}
        merged.update(replay=str(self.path), out=cfg.out, quiet=cfg.quiet, resume=None, report=None,
                      eval_cache=None, ray=None, ray_actors=None, gpus=None,
                      generations=min(int(saved.get("generations") or 0), int(self.checkpoint.get("round") or 0)))
        if "reference_limit" in given:
            merged["reference_limit"] = cfg.reference_limit
        return Config(**merged)

    def clients(self):
        """The main and secondary LLMs of the recording, answering from its transcript."""
        cfg = self.meta["config"]
        main = ReplayClient(self, "main", cfg.get("model"))
        return main, (ReplayClient(self, "secondary", cfg.get("secondary_model"))
                      if cfg.get("secondary_model") else None)

    def evaluator(self, real, say=print) -> "ReplayEvaluator":
        return ReplayEvaluator(self, real, say)

    # -- matching ---------------------------------------------------------------------------------

    def answer(self, island: int, role: str, prompt: str) -> dict:
        """The recorded call that island `island` makes next, checked against this one."""
        with self._lock:
            if self.stopped:
                raise ReplayMismatch(self.stopped)
            queue = self.queues.get(island, [])
            k = self.position.get(island, 0)
            if k >= len(queue):
                self._stop(f"island {island} asks for a {prompt_kind(prompt)} call, its call {k + 1}, but the "
                           f"recording has only {len(queue)} for it")
            self.position[island] = k + 1
        call = queue[k]
        recorded = self.reading.prompt(call)
        name = (f"call {call.get('call')} of the recording (island {island}, generation {call.get('generation')}, "
                f"{call.get('purpose')})")
        if call.get("role") != role:
            self._stop(f"{name} was made by the {call.get('role')} model, now by the {role} model")
        if prompt != recorded:
            self._stop(f"{name}: the prompt differs {_where_differs(recorded, prompt)}")
        return call

    def _stop(self, why: str):
        with_path = f"replay of {self.path} stopped: {why}"
        self.stopped = self.stopped or with_path
        raise ReplayMismatch(with_path)


class ReplayClient:
    """A recorded model: `for_island(i)` is the callable island i's HCM calls; `usage` and `last` read like
    llm.Client's (the probes' tokens count, as they did in the recording)."""

    def __init__(self, recording: Recording, role: str, model: str | None):
        self.recording, self.role, self.model = recording, role, model
        self.usage = dict(calls=0, prompt_tokens=0, completion_tokens=0, reasoning_tokens=0, total_tokens=0,
                          retries=0, failures=0, probes=0)
        self._local, self._lock = threading.local(), threading.Lock()
        for call in recording.reading.calls:
            if call.get("stage") == "setup" and call.get("role") == role:
                self._count(call)
                self.usage["probes"] += 1

    def for_island(self, island: int) -> "_IslandView":
        return _IslandView(self, island)

    @property
    def last(self):
        return getattr(self._local, "last", None)

    def __call__(self, prompt: str) -> str:
        raise ReplayMismatch("a replayed model was called outside an island; nothing was recorded for that")

    def _ask(self, island: int, prompt: str) -> str:
        call = self.recording.answer(island, self.role, prompt)
        self._count(call)
        tokens = call.get("tokens") or {}
        self._local.last = SimpleNamespace(usage=dict(tokens, total=tokens.get("input", 0) + tokens.get("output", 0)),
                                           finish=call.get("finish"))
        if call.get("error") is not None:
            raise _error(call["error"])
        return self.recording.reading.text(call.get("reply"))

    def _count(self, call: dict) -> None:
        t = call.get("tokens") or {}
        with self._lock:
            self.usage["calls"] += 1
            self.usage["prompt_tokens"] += int(t.get("input") or 0)
            self.usage["completion_tokens"] += int(t.get("output") or 0)
            self.usage["reasoning_tokens"] += int(t.get("reasoning") or 0)
            self.usage["total_tokens"] += int(t.get("input") or 0) + int(t.get("output") or 0)
            self.usage["failures"] += call.get("error") is not None


class _IslandView:
    """What island `island` calls: the recorded model, answering that island's calls in order."""

    def __init__(self, client: ReplayClient, island: int):
        self.client, self.island = client, island

    def __call__(self, prompt: str) -> str:
        return self.client._ask(self.island, prompt)

    @property
    def last(self):   # llm_check counts each island's tokens from it
        return self.client.last


class ReplayEvaluator:
    """The real evaluator; `evaluate` runs it and returns the recording's result, with this machine's verdict
    beside it (details["replay"]). Anything else (baseline_ms, close, opts ...) is the real evaluator's."""

    def __init__(self, recording: Recording, real, say=print):
        self.recording, self.real, self.say = recording, real, say
        self.checks: list[dict] = []
        self._lock = threading.Lock()

    def evaluate(self, src: str):
        pid = program_id(src)
        recorded = self.recording.results.get(pid)
        if recorded is None:
            self.recording._stop(f"candidate {pid} was never evaluated in the recording")
        result = json.loads(json.dumps(recorded))
        if self.real is not None:
            now = self.real.evaluate(src).to_dict()
            check = {"program": pid, "status": now.get("status"), "recorded_status": recorded.get("status"),
                     "speedup": now.get("speedup"), "recorded_speedup": recorded.get("speedup"),
                     "runtime_ms": now.get("runtime_ms"), "message": " ".join(str(now.get("message")).split())[:300]}
            result.setdefault("details", {})["replay"] = check
            with self._lock:
                self.checks.append(check)
            if check["status"] != check["recorded_status"]:
                self.say(f"replay: candidate {pid} is {check['status']} on this machine, {check['recorded_status']} "
                         f"in the recording ({check['message'][:200]})")
        return SimpleNamespace(to_dict=lambda: result)

    def __getattr__(self, name):
        if name == "real":
            raise AttributeError(name)
        return getattr(self.real, name)

    def replay_summary(self) -> str:
        """One line: verdicts that match the recording, and this machine's speedups against the recorded."""
        with self._lock:
            checks = list(self.checks)
        if not checks:
            return "no candidate evaluated again"
        same = sum(c["status"] == c["recorded_status"] for c in checks)
        ratios = [c["speedup"] / c["recorded_speedup"] for c in checks
                  if c["status"] == "ok" and c["recorded_status"] == "ok" and c.get("speedup")
                  and c.get("recorded_speedup")]
        text = (f"{len(checks)} candidates evaluated again on this machine: the verdict matches the recording "
                f"for {same} of {len(checks)}")
        if ratios:
            text += (f"; speedup now / recorded: median {statistics.median(ratios):.3f} "
                     f"(from {min(ratios):.3f} to {max(ratios):.3f})")
        return text

    @property
    def mismatches(self) -> int:
        return sum(c["status"] != c["recorded_status"] for c in self.checks)


# ----------------------------------------------------------------------------- helpers

def _json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _results(path: Path, meta: dict) -> dict[str, dict]:
    """The recording's evaluation results by program id (its evals/, or the --eval-cache it used)."""
    dirs = [path / "evals"]
    cache = (meta.get("config") or {}).get("eval_cache")
    if cache:
        dirs.append(Path(cache))
    out: dict[str, dict] = {}
    for d in dirs:
        for f in sorted(d.glob("*.json")) if d.is_dir() else []:
            r = _json(f)
            if isinstance(r, dict) and isinstance(r.get("program_id"), str) and "status" in r:
                out.setdefault(r["program_id"], r)
    return out


def _error(text: str) -> Exception:
    """The recorded failure "Class: message" as an exception of that class (an llm.LLMError)."""
    name, _, message = text.partition(": ")
    cls = getattr(llm, name, None)
    if not (isinstance(cls, type) and issubclass(cls, llm.LLMError)):
        cls = type(name if name.isidentifier() else "LLMError", (llm.LLMError,), {})
    return cls(message)


def _where_differs(recorded: str, now: str) -> str:
    """Where two prompts first differ, in words: the line and both texts there."""
    k = next((i for i, (a, b) in enumerate(zip(recorded, now)) if a != b), min(len(recorded), len(now)))
    line = recorded.count("\n", 0, k) + 1
    start = max(0, k - 20)
    return (f"at character {k + 1} (line {line}): recorded {recorded[start:k + 40]!r}, now {now[start:k + 40]!r}"
            + (f" (recorded {len(recorded)} characters, now {len(now)})" if len(recorded) != len(now) else ""))

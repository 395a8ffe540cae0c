"""Guards around the LLM: a probe before a run starts, and a watch on failures while it runs.

    probe(client, role, origin)  # one short call; raises ProbeFailed with one line: model, class, message, fix
    watch = FailureWatch(limit)  # counts LLM failures in a row across all islands
    llm = watch.wrap(client, island)   # what HCM calls; tokens are counted per island
    watch.tripped                # `limit` calls in a row failed: the run stops after this round
    failed_classes(notes)        # the error classes of a generation's failed calls, from HCM's notes

The client (llm.py) already retries what may heal (connection resets, 429, 5xx) within a call; a call
that succeeded after retries is a success here. Once the watch has tripped, further calls fail at once
without touching the network, so the round in flight ends within seconds and its state can be saved.
"""
from __future__ import annotations

import logging
import re
import threading
from dataclasses import dataclass

import llm

PROBE_PROMPT = "Reply with the single word OK."
# How each provider sends the key, for the fix of a 401 from a server the user runs
KEY_SENT = {"openai": "as the bearer token", "gemini": "in the x-goog-api-key header",
            "anthropic": "in the x-api-key header"}


@dataclass
class Origin:
    """Where a client's settings came from, so a fix names the setting the user actually made."""
    model: str = "--model"           # or "--secondary-model", "PACEVOLVE_MODEL"
    base_url: str = "--base-url"     # or "OPENAI_BASE_URL", or "" for the provider's own API


class ProbeFailed(Exception):
    """The probe call failed; str() is the one line to show."""


class LLMStopped(llm.LLMError):
    """Raised instead of calling the LLM once the run is stopping after too many failures."""
    request_sent = False   # the transcript keeps no record of it


def probe(client, role: str, origin: Origin | None = None) -> None:
    """One short call to `client`; any failure raises ProbeFailed naming model, URL, error class and fix.
    A reply cut off by the output limit still proves the model answers."""
    level = llm.log.level
    llm.log.setLevel(logging.ERROR)   # the retries' warnings: the one line below says it all
    try:
        client(PROBE_PROMPT)
    except llm.TruncatedOutput:
        return
    except llm.LLMError as err:
        raise ProbeFailed(f"the {role} model {client.model!r} at {client.base_url} failed a test call: "
                          f"{type(err).__name__}: {_server_message(err)}. Fix: {fix_for(err, client, origin)}") \
            from None
    finally:
        llm.log.setLevel(level)


def fix_for(err: Exception, client, origin: Origin | None = None) -> str:
    """What the user can do about `err`, in terms of the option or variable each setting came from."""
    origin = origin or Origin()
    keys = " or ".join(llm.KEY_VARIABLES.get(client.provider, ()))
    local = client.base_url not in llm.DEFAULT_BASE_URLS.values()
    url = origin.base_url or "--base-url"
    if isinstance(err, llm.AuthError):
        sent = KEY_SENT.get(client.provider, "")
        return (f"check the API key the server expects ({keys}, sent {sent})" if local
                else f"set a valid key in {keys}")
    if isinstance(err, (llm.TransportError, llm.DeadlineExceeded)):
        return (f"start the server, or correct {url} (now {client.base_url})" if local
                else "check the network connection, or try again later")
    if isinstance(err, llm.ModelNotFound):
        where = f" and that {url} ends where the API starts (usually /v1)" if local else ""
        return (f"check {origin.model} (now {client.model}; the server lists its models at "
                f"{client.base_url}/models){where}")
    if isinstance(err, llm.QuotaExceeded):
        return f"add credit or wait for the quota to refill, or use another model ({origin.model})"
    if isinstance(err, llm.RateLimited):
        return "wait and try again, or use fewer --islands"
    if isinstance(err, (llm.MalformedResponse, llm.EmptyResponse)):
        return (f"{url} {client.base_url} did not answer like an OpenAI-compatible chat API; "
                f"point it at the API root (usually ending in /v1) and check {origin.model}")
    if isinstance(err, llm.ContextLengthExceeded):
        return "use a model with a larger context window"
    return f"check {origin.model}, --provider and {url}, and the server's own log"


class FailureWatch:
    """Consecutive LLM failures across all islands, failures per error class, tokens per island."""

    def __init__(self, limit: int):
        self.limit = limit
        self.in_a_row = 0
        self.by_class: dict[str, int] = {}
        self.tokens: dict[str, int] = {}      # island index (as a JSON key) -> prompt + output tokens
        self.last_error = ""
        self._lock = threading.Lock()

    @property
    def tripped(self) -> bool:
        return self.in_a_row >= self.limit

    def wrap(self, client, island: int):
        return _Watched(self, client, island) if client is not None else None

    def to_dict(self) -> dict:
        return {"in_a_row": self.in_a_row, "by_class": self.by_class, "tokens": self.tokens,
                "last_error": self.last_error}

    def restore(self, d: dict) -> None:
        # the count in a row starts again: the user has had the chance to fix what failed
        self.by_class = dict(d.get("by_class", {}))
        self.tokens = dict(d.get("tokens", {}))

    def _success(self, island: int, tokens: int) -> None:
        with self._lock:
            self.in_a_row = 0
            self.tokens[str(island)] = self.tokens.get(str(island), 0) + tokens

    def _failure(self, err: Exception) -> None:
        with self._lock:
            self.in_a_row += 1
            name = type(err).__name__
            self.by_class[name] = self.by_class.get(name, 0) + 1
            self.last_error = f"{name}: {_one_line(err)}"


class _Watched:
    """A client as HCM sees it: a callable `(prompt) -> str` that reports to the watch."""

    def __init__(self, watch: FailureWatch, client, island: int):
        self.watch, self.client, self.island = watch, client, island

    def __call__(self, prompt: str) -> str:
        if self.watch.tripped:
            raise LLMStopped(f"not called: {self.watch.limit} LLM calls in a row failed")
        try:
            text = self.client(prompt)
        except Exception as err:   # BaseExceptions (Ctrl-C, test sentinels) pass through untouched
            self.watch._failure(err)
            raise
        last = getattr(self.client, "last", None)
        usage = getattr(last, "usage", None) or {}
        self.watch._success(self.island, int(usage.get("input", 0)) + int(usage.get("output", 0)))
        return text

    @property
    def usage(self):
        return getattr(self.client, "usage", {})


def failed_classes(notes: list[str]) -> list[str]:
    """The error classes of the LLM calls that failed in one generation, read from HCM's notes."""
    return re.findall(r"LLM call failed \([^)]*\): (\w+)", "\n".join(notes))


def _server_message(err: Exception) -> str:
    """The server's words, without the transport library's wrapping around a failed connection (looked
    for in the whole message: a long URL pushes the cause past any cut)."""
    text = " ".join(str(err).split())
    if isinstance(err, llm.TransportError):
        refused = re.search(r"\[Errno -?\d+\] [^'\")]+", text)
        if refused:
            return f"no connection ({refused.group(0).strip()})"
        if "timed out" in text.lower():
            return "no answer in time (timed out)"
    return _one_line(err)


def _one_line(err: Exception, limit: int = 300) -> str:
    text = " ".join(str(err).split())
    return text[:limit] + (" ..." if len(text) > limit else "")

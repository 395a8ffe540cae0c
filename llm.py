"""A small raw-HTTP chat client: OpenAI-compatible servers, Gemini generateContent and Anthropic Messages.

PACEvolve (Sec. 4 of the paper) drives every step of the search, from idea generation to kernel writing and
repair, with LLM calls: Gemini 2.5 Pro, with Gemini 2.5 Flash as the secondary model. This module is the
one place those calls cross the network. It turns a prompt into answer text, or raises a typed `LLMError`.

    client = Client.from_env("gemini-2.5-pro")      # reads GEMINI_API_KEY
    text = client("Write a CUDA kernel that ...")    # client.last: finish reason, usage, truncated flag

Behaviour (the providers' wire formats and rules as their API references state them):
- providers: "openai" (api.openai.com or any compatible server: vLLM, Ollama, llama.cpp, OpenRouter,
  DeepSeek, Together, Gemini's OpenAI endpoint), "gemini" (native generateContent), "anthropic" (Messages);
- retries only what may succeed next time (connection errors, timeouts, 408, 409, 429, 5xx, 529) with
  capped exponential backoff and jitter; honours retry-after-ms, Retry-After and Gemini's RetryInfo; fails
  fast when the wait asked for is over `max_retry_wait_s` or the 429 is an exhausted quota;
- one wall-clock deadline per call covers every attempt, every sleep and slowly trickled bodies;
- a reply that is not an answer (empty, blocked, HTML, an error inside a 200) raises; a reply cut off by
  the output limit returns its text with `client.last.truncated = True`; reasoning never enters the text;
- the API key is sent only in a header and is scrubbed from every error message and log line (`redact`);
  replies reach the caller exactly as sent, and a "key" shorter than MIN_SECRET_CHARS (a local server's
  placeholder such as "x", "EMPTY" or "dummy") is never treated as a secret, so no text loses a letter.
Left out: streaming, tools, images, async. Only `requests` (and its urllib3) beyond the standard library.
"""
from __future__ import annotations

import email.utils
import json
import logging
import os
import random
import re
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable

import requests
import urllib3  # requests' transport: its errors surface while we read a streamed body

log = logging.getLogger(__name__)

DEFAULT_BASE_URLS = {
    "openai": "https://api.openai.com/v1",
    "gemini": "https://generativelanguage.googleapis.com/v1beta",
    "anthropic": "https://api.anthropic.com/v1",
}
KEY_VARIABLES = {"openai": ("OPENAI_API_KEY",), "gemini": ("GEMINI_API_KEY", "GOOGLE_API_KEY"),
                 "anthropic": ("ANTHROPIC_API_KEY",)}
ANTHROPIC_VERSION = "2023-06-01"
ANTHROPIC_DEFAULT_MAX_TOKENS = 8192  # Anthropic requires max_tokens; 8192 is accepted by every current model
MAX_BODY_BYTES = 64 << 20
# Body markers that make an error permanent or change its class, matched in lower case.
QUOTA_MARKERS = ("insufficient_quota", "enforced_spend_limit", "perday", "billing_error")
CONTEXT_MARKERS = ("context_length", "context length", "context window", "exceed_context", "maximum context",
                   "prompt is too long")
# No hosted API issues a key this short (theirs run 32-110 characters); shorter values are local
# servers' placeholders, which protect nothing, and redacting them would cut letters out of any text.
MIN_SECRET_CHARS = 20


# ---------------------------------------------------------------------------------------------- errors
class LLMError(Exception):
    """Any failed call. `retryable` says whether the same request may succeed later."""

    def __init__(self, message: str, status: int | None = None, retryable: bool = False, provider: str = "",
                 request_id: str | None = None, *, error_type: str = "", retry_after: float | None = None):
        super().__init__(message)
        self.message, self.status, self.retryable, self.provider = message, status, retryable, provider
        self.request_id, self.error_type, self.retry_after = request_id, error_type, retry_after

    def __str__(self) -> str:
        where = " ".join(x for x in (self.provider, f"HTTP {self.status}" if self.status else "") if x)
        return f"{where}: {self.message}" if where else self.message

    def redact(self, secret: str | None) -> None:
        """Scrubs `secret` from the message (and the exception's args, which repr shows)."""
        self.message = redact(self.message, secret)
        self.args = tuple(redact(a, secret) if isinstance(a, str) else a for a in self.args)


class AuthError(LLMError): """Bad or missing key, or no permission (401, 403, Gemini API_KEY_INVALID)."""
class RateLimited(LLMError): """429 rate limit: retried unless the server asks for too long a wait."""
class QuotaExceeded(LLMError): """Out of credit or daily quota (402, insufficient_quota, PerDay): never retried."""
class ContextLengthExceeded(LLMError): """Prompt plus output limit exceed the model's context window."""
class ModelNotFound(LLMError): """404: unknown model, or a wrong base URL."""
class RequestTooLarge(LLMError): """413: the request body is over the server's size limit."""
class ContentBlocked(LLMError): """The output was filtered or refused; error_type holds the reason."""
class PromptBlocked(LLMError): """Gemini blocked the prompt itself; error_type holds promptFeedback.blockReason."""
class EmptyResponse(LLMError): """A well-formed reply without answer text."""
class TruncatedOutput(EmptyResponse): """The output limit was reached before any answer text (reasoning used it)."""
class MalformedResponse(LLMError): """A 2xx body that is not the expected JSON (proxy HTML, truncated JSON)."""
class TransportError(LLMError): """Connection failed, reset or timed out; no HTTP status."""
class ProviderError(LLMError): """Any other HTTP or in-band error (5xx, 400, 422, OpenRouter's error in a 200)."""
class DeadlineExceeded(LLMError): """The call's total wall-clock deadline passed."""


# ---------------------------------------------------------------------------------------------- reply
@dataclass
class Reply:
    """One normalised reply, whatever the provider."""
    text: str
    reasoning: str = ""           # reasoning/thinking text, never part of `text`
    finish: str = "other"         # stop | length | tool_calls | content_filter | error | other
    raw_finish: str | None = None  # the provider's own value, e.g. "MAX_TOKENS", "end_turn"
    truncated: bool = False       # cut off by the output limit: text may be incomplete
    usage: dict = field(default_factory=dict)  # input, output (reasoning included), reasoning, total
    request_id: str | None = None
    status: int | None = None
    refusal: str = ""             # refusal text or block category, when the output was withheld


# ---------------------------------------------------------------------------------------------- client
class Client:
    """A callable `(prompt) -> str` for one provider and model; safe to share between threads."""

    def __init__(self, provider: str, model: str, base_url: str | None = None, api_key: str | None = None, *,
                 timeout_s: float = 600.0, connect_timeout_s: float = 10.0, deadline_s: float = 1200.0,
                 max_retries: int = 2, temperature: float | None = None, max_output_tokens: int | None = None,
                 reasoning_effort: str | int | None = None, max_retry_wait_s: float = 120.0,
                 sleep: Callable[[float], None] = time.sleep, session: requests.Session | None = None):
        """timeout_s is the read timeout between bytes; deadline_s bounds the whole call, retries included.
        max_output_tokens=None sends no limit (the server's default) except to Anthropic, which needs one.
        reasoning_effort: a level string ("low", "high", ...) becomes OpenAI `reasoning_effort`, Gemini
        `thinkingLevel` or Anthropic `output_config.effort`; an int is a thinking budget in tokens (Gemini
        `thinkingBudget`, Anthropic `thinking.budget_tokens`)."""
        if provider not in DEFAULT_BASE_URLS:
            raise ValueError(f"provider must be one of {sorted(DEFAULT_BASE_URLS)}, got {provider!r}")
        if provider == "openai" and isinstance(reasoning_effort, int):
            raise ValueError("OpenAI-compatible servers take reasoning_effort as a level string, not a budget")
        if max_retries < 0 or deadline_s <= 0:
            raise ValueError("max_retries must be >= 0 and deadline_s > 0")
        self.provider, self.model = provider, model
        self.base_url = (base_url or DEFAULT_BASE_URLS[provider]).rstrip("/")
        self._api_key = api_key or None
        self.timeout_s, self.connect_timeout_s, self.deadline_s = timeout_s, connect_timeout_s, deadline_s
        self.max_retries, self.max_retry_wait_s = max_retries, max_retry_wait_s
        self.temperature, self.reasoning_effort = temperature, reasoning_effort
        self.max_output_tokens = max_output_tokens or (ANTHROPIC_DEFAULT_MAX_TOKENS if provider == "anthropic"
                                                       else None)
        self.sleep, self.session = sleep, session or requests.Session()
        self.usage = dict(calls=0, prompt_tokens=0, completion_tokens=0, reasoning_tokens=0, total_tokens=0,
                          retries=0, failures=0)
        self._lock, self._local, self._rng = threading.Lock(), threading.local(), random.Random()

    @classmethod
    def from_env(cls, model: str, provider: str | None = None, base_url: str | None = None, **kw) -> Client:
        """Pick the provider from the arguments or the model name and read the usual variables."""
        provider = provider or detect_provider(model, base_url)
        if provider == "openai":
            base_url = base_url or os.environ.get("OPENAI_BASE_URL") or None
        if "api_key" not in kw:
            kw["api_key"] = next((os.environ[v] for v in KEY_VARIABLES[provider] if os.environ.get(v)), None)
        if not kw["api_key"] and base_url is None:  # a hosted API always needs a key; a local server may not
            raise AuthError(f"no API key: set {' or '.join(KEY_VARIABLES[provider])}", provider=provider)
        return cls(provider, model, base_url, **kw)

    def __repr__(self) -> str:
        key = "set" if self._api_key else "none"
        return f"Client(provider={self.provider!r}, model={self.model!r}, base_url={self.base_url!r}, key={key})"

    def redact(self, text: str) -> str:
        """`text` with this client's API key replaced by "[redacted]": for error messages, logs and
        transcripts, never for replies the search reads."""
        return redact(text, self._api_key)

    @property
    def last(self) -> Reply | None:
        """The latest parsed reply of this thread (also set when that reply then raised), else None."""
        return getattr(self._local, "last", None)

    @property
    def last_retries(self) -> int:
        """How many times this thread's latest call was retried."""
        return getattr(self._local, "retries", 0)

    def __call__(self, prompt: str) -> str:
        if not isinstance(prompt, str):
            raise ValueError(f"prompt must be a str, got {type(prompt).__name__}")
        return self.chat([{"role": "user", "content": prompt}])

    def chat(self, messages: list[dict]) -> str:
        """Send `[{"role": "system"|"user"|"assistant", "content": str}, ...]`; return the answer text."""
        check_messages(messages)
        url, headers, body = PROVIDERS[self.provider][0](self, messages)
        self._local.last, self._local.retries = None, 0
        deadline = time.monotonic() + self.deadline_s
        self._count(calls=1)
        attempt = 0
        while True:
            try:
                return self._attempt(url, headers, body, deadline).text
            except LLMError as err:
                err.provider = self.provider
                err.redact(self._api_key)   # some servers echo the key back in error messages
                wait = self._retry_wait(err, attempt, deadline)
                if wait is None:
                    self._count(failures=1)
                    raise
                log.warning("%s; retry %d of %d in %.1f s", err, attempt + 1, self.max_retries, wait)
                self._count(retries=1)
                self.sleep(wait)
                attempt += 1
                self._local.retries = attempt

    def _retry_wait(self, err: LLMError, attempt: int, deadline: float) -> float | None:
        """Seconds to sleep before the next attempt, or None to give up now."""
        if not err.retryable or attempt >= self.max_retries:
            return None
        if err.retry_after is not None and err.retry_after > 0:
            wait = err.retry_after
        else:  # openai-python's schedule: 0.5 s, 1 s, 2 s ... capped at 8 s, minus up to 25% jitter
            wait = min(0.5 * 2 ** attempt, 8.0) * (1 - 0.25 * self._rng.random())
        if wait > self.max_retry_wait_s or time.monotonic() + wait >= deadline:
            err.message += f" (a retry would wait {wait:.0f} s: over max_retry_wait_s or the deadline)"
            return None
        return wait

    def _attempt(self, url: str, headers: dict, body: dict, deadline: float) -> Reply:
        status, resp_headers, text = self._post(url, headers, body, deadline)
        if not 200 <= status < 300:
            raise http_error(status, text, resp_headers)
        data = parse_json_object(text, status, resp_headers)
        try:
            reply = PROVIDERS[self.provider][1](data)
        except (KeyError, IndexError, TypeError, AttributeError, ValueError) as exc:
            raise MalformedResponse(f"unexpected reply shape ({exc!r}): {snippet(text)}", status) from exc
        reply.status = status
        reply.request_id = resp_headers.get("x-request-id") or resp_headers.get("request-id") or reply.request_id
        self._local.last = reply
        u = reply.usage
        self._count(prompt_tokens=u["input"], completion_tokens=u["output"], reasoning_tokens=u["reasoning"],
                    total_tokens=u["total"])
        check_answer(reply)
        return reply

    def _post(self, url: str, headers: dict, body: dict, deadline: float) -> tuple[int, dict, str]:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise DeadlineExceeded(f"deadline of {self.deadline_s:g} s passed")
        timeout = (min(self.connect_timeout_s, remaining), min(self.timeout_s, remaining))
        try:  # no redirects: requests would turn a redirected POST into a GET without a body
            with self.session.post(url, json=body, headers=headers, timeout=timeout, stream=True,
                                   allow_redirects=False) as r:
                return r.status_code, r.headers, read_body(r, deadline, self.deadline_s)
        except (requests.Timeout, urllib3.exceptions.TimeoutError) as exc:
            if time.monotonic() >= deadline:
                raise DeadlineExceeded(f"deadline of {self.deadline_s:g} s passed") from exc
            raise TransportError(f"timed out: {_transport_text(exc)}", retryable=True) from exc
        except (requests.RequestException, urllib3.exceptions.HTTPError) as exc:
            # InvalidURL, MissingSchema and the like are ValueErrors too: a bad base_url will not heal
            raise TransportError(f"{type(exc).__name__}: {_transport_text(exc)}",
                                 retryable=not isinstance(exc, ValueError)) from exc

    def _count(self, **amounts: int) -> None:
        with self._lock:
            for name, n in amounts.items():
                self.usage[name] += n


def redact(text: str, secret: str | None) -> str:
    """`text` with every occurrence of `secret` replaced by "[redacted]"; a secret shorter than
    MIN_SECRET_CHARS is a placeholder and changes nothing."""
    if not secret or len(secret) < MIN_SECRET_CHARS:
        return text
    return text.replace(secret, "[redacted]")


def _transport_text(exc: Exception) -> str:
    """requests' text for a failed connection, cut to the host and the cause: its own text repeats the URL
    and nests the cause several times (near 500 characters for a Gemini URL)."""
    text = str(exc)
    host = re.search(r"host='([^']+)', port=(\d+)", text)
    cause = (re.search(r"\[Errno -?\d+\] [^'\")]+", text) or re.search(r"(Read|Connect) timed out", text))
    if host and cause:
        return f"{host[1]}:{host[2]}: {cause[0].strip()}"
    return text


def detect_provider(model: str, base_url: str | None = None) -> str:
    """An explicit base_url means an OpenAI-compatible server; otherwise the model name decides."""
    name = model.lower()
    if base_url:
        return "openai"
    if "claude" in name:
        return "anthropic"
    if "gemini" in name:
        return "gemini"
    if re.search(r"gpt|openai|(^|/)o[134]\b", name) or os.environ.get("OPENAI_BASE_URL"):
        return "openai"
    raise ValueError(f"cannot tell the provider of model {model!r}: pass provider= or base_url=")


def check_messages(messages: list[dict]) -> None:
    if not messages or not all(isinstance(m, dict) and m.get("role") in ("system", "user", "assistant")
                               and isinstance(m.get("content"), str) for m in messages):
        raise ValueError('messages must be a non-empty list of {"role": system|user|assistant, "content": str}')


def read_body(response: requests.Response, deadline: float, deadline_s: float) -> str:
    """Read the whole body, checking the deadline after every piece: the read timeout restarts on each byte,
    so a server trickling keep-alive newlines (DeepSeek under load) could otherwise hold a call forever."""
    raw, chunks, size = response.raw, [], 0
    while True:
        # read1 returns whatever has arrived; urllib3 < 2.3 lacks it, and read(n) would wait for n bytes
        chunk = (raw.read1(65536, decode_content=True) if hasattr(raw, "read1")
                 else raw.read(1, decode_content=True))
        if not chunk:
            return b"".join(chunks).decode("utf-8", errors="replace")
        chunks.append(chunk)
        size += len(chunk)
        if time.monotonic() > deadline:
            raise DeadlineExceeded(f"deadline of {deadline_s:g} s passed while the body was arriving")
        if size > MAX_BODY_BYTES:
            raise MalformedResponse(f"reply body over {MAX_BODY_BYTES} bytes", response.status_code)


def check_answer(reply: Reply) -> None:
    """Turn replies that are not answers into errors; a truncated answer with text passes."""
    if reply.finish == "content_filter":
        why = f": {reply.refusal}" if reply.refusal else ""
        raise ContentBlocked(f"output withheld (finish {reply.raw_finish}){why}", reply.status,
                             request_id=reply.request_id, error_type=str(reply.raw_finish))
    if not reply.text.strip():
        if reply.truncated:
            raise TruncatedOutput(f"output limit reached before any answer text ({reply.usage['reasoning']} "
                                  "reasoning tokens): raise max_output_tokens or lower reasoning_effort",
                                  reply.status, request_id=reply.request_id, error_type=str(reply.raw_finish))
        raise EmptyResponse(f"reply has no answer text (finish {reply.raw_finish})", reply.status,
                            request_id=reply.request_id, error_type=str(reply.raw_finish))


def normal_usage(input_tokens, output_tokens, reasoning_tokens=0, total_tokens=None) -> dict:
    """Counts that are missing or not numbers become 0; total is the reported one when there is one."""
    n = [int(x) if isinstance(x, (int, float)) else 0 for x in (input_tokens, output_tokens, reasoning_tokens)]
    total = int(total_tokens) if isinstance(total_tokens, (int, float)) else n[0] + n[1]
    return {"input": n[0], "output": n[1], "reasoning": n[2], "total": total}


def split_system(messages: list[dict]) -> tuple[str, list[dict]]:
    system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
    return system, [m for m in messages if m["role"] != "system"]


def auth_headers(name: str, value: str | None) -> dict:
    return {name: value} if value else {}  # no key (a local server): send no auth header at all


# ------------------------------------------------------------------ OpenAI Chat Completions and compatible
OPENAI_FINISH = {"stop": "stop", "length": "length", "tool_calls": "tool_calls", "function_call": "tool_calls",
                 "content_filter": "content_filter", "error": "error"}


def openai_request(c: Client, messages: list[dict]) -> tuple[str, dict, dict]:
    body: dict = {"model": c.model, "messages": messages}
    if c.max_output_tokens:
        # OpenAI's reasoning models reject max_tokens; Ollama and other compatible servers ignore the new name.
        hosted = "api.openai.com" in c.base_url
        body["max_completion_tokens" if hosted else "max_tokens"] = c.max_output_tokens
    if c.temperature is not None:
        body["temperature"] = c.temperature
    if c.reasoning_effort is not None:
        body["reasoning_effort"] = c.reasoning_effort
    headers = auth_headers("Authorization", c._api_key and f"Bearer {c._api_key}")
    return f"{c.base_url}/chat/completions", headers, body


def openai_reply(data: dict) -> Reply:
    choices = data.get("choices") or []
    if not choices:
        raise EmptyResponse("reply has no choices", 200)
    choice = choices[0]
    if choice.get("error") or choice.get("finish_reason") == "error":  # OpenRouter: upstream failed mid-way
        raise in_band_error(choice.get("error") or {"message": "finish_reason is 'error'"})
    message = choice.get("message") or {}
    content = message.get("content") or ""
    if isinstance(content, list):  # a few servers send content parts
        content = "".join(p.get("text") or "" for p in content if isinstance(p, dict))
    # vLLM >= 0.11, Ollama and OpenRouter use `reasoning`; DeepSeek, llama.cpp and older vLLM `reasoning_content`
    reasoning = message.get("reasoning") or message.get("reasoning_content") or ""
    raw = choice.get("finish_reason")
    finish = OPENAI_FINISH.get(raw, "other")
    refusal = message.get("refusal") or ""
    if refusal and not content:
        finish = "content_filter"
    u = data.get("usage") or {}
    details = u.get("completion_tokens_details") or {}
    return Reply(str(content), str(reasoning), finish, raw, finish == "length",
                 normal_usage(u.get("prompt_tokens"), u.get("completion_tokens"), details.get("reasoning_tokens"),
                              u.get("total_tokens")), request_id=data.get("id"), refusal=str(refusal))


# ---------------------------------------------------------------------------------- Gemini generateContent
GEMINI_BLOCKED = {"SAFETY", "IMAGE_SAFETY", "RECITATION", "IMAGE_RECITATION", "BLOCKLIST", "PROHIBITED_CONTENT",
                  "IMAGE_PROHIBITED_CONTENT", "SPII"}
GEMINI_TOOL_ERRORS = {"MALFORMED_FUNCTION_CALL", "UNEXPECTED_TOOL_CALL", "TOO_MANY_TOOL_CALLS"}


def gemini_request(c: Client, messages: list[dict]) -> tuple[str, dict, dict]:
    system, turns = split_system(messages)
    body: dict = {"contents": [{"role": "model" if m["role"] == "assistant" else "user",
                                "parts": [{"text": m["content"]}]} for m in turns]}
    if system:
        body["systemInstruction"] = {"parts": [{"text": system}]}
    config: dict = {}
    if c.temperature is not None:
        config["temperature"] = c.temperature
    if c.max_output_tokens:
        config["maxOutputTokens"] = c.max_output_tokens
    if c.reasoning_effort is not None:  # exactly one of the two: sending both is a 400
        effort = c.reasoning_effort
        config["thinkingConfig"] = ({"thinkingBudget": effort} if isinstance(effort, int)
                                    else {"thinkingLevel": str(effort).upper()})
    if config:
        body["generationConfig"] = config
    model = c.model.removeprefix("models/")
    # The key goes in a header, never in `?key=`, where it would leak into logs and error messages.
    return f"{c.base_url}/models/{model}:generateContent", auth_headers("x-goog-api-key", c._api_key), body


def gemini_reply(data: dict) -> Reply:
    feedback = data.get("promptFeedback") or {}
    if feedback.get("blockReason"):  # the prompt itself was blocked: there are no candidates at all
        reason = feedback["blockReason"]
        raise PromptBlocked(f"prompt blocked ({reason}) {feedback.get('blockReasonMessage') or ''}".strip(), 200,
                            error_type=reason)
    candidates = data.get("candidates") or []
    if not candidates:
        raise EmptyResponse("reply has no candidates", 200)
    candidate = candidates[0]
    # Thinking can use the whole budget: then `content` has no `parts`. A part may hold only a thoughtSignature.
    parts = (candidate.get("content") or {}).get("parts") or []
    text = "".join(p.get("text") or "" for p in parts if not p.get("thought"))
    reasoning = "".join(p.get("text") or "" for p in parts if p.get("thought"))
    raw = candidate.get("finishReason")
    finish = ("stop" if raw == "STOP" else "length" if raw == "MAX_TOKENS" else
              "content_filter" if raw in GEMINI_BLOCKED else "error" if raw in GEMINI_TOOL_ERRORS else "other")
    if finish == "stop" and any("functionCall" in p for p in parts):
        finish = "tool_calls"
    u = data.get("usageMetadata") or {}
    thoughts = u.get("thoughtsTokenCount") or 0
    candidates_tokens = u.get("candidatesTokenCount") or 0
    # total = prompt + candidates + tool prompt + thoughts, so it is taken as reported, never recomputed
    return Reply(text, reasoning, finish, raw, finish == "length",
                 normal_usage(u.get("promptTokenCount"), candidates_tokens + thoughts, thoughts,
                              u.get("totalTokenCount")),
                 request_id=data.get("responseId"), refusal=str(candidate.get("finishMessage") or ""))


# ---------------------------------------------------------------------------------- Anthropic Messages
ANTHROPIC_FINISH = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length",
                    "model_context_window_exceeded": "length", "tool_use": "tool_calls",
                    "refusal": "content_filter"}


def anthropic_request(c: Client, messages: list[dict]) -> tuple[str, dict, dict]:
    system, turns = split_system(messages)
    body: dict = {"model": c.model, "max_tokens": c.max_output_tokens, "messages": turns}
    if system:
        body["system"] = system
    effort = c.reasoning_effort
    if isinstance(effort, int):  # extended thinking: the budget must be below max_tokens
        body["thinking"] = {"type": "enabled", "budget_tokens": effort}
    elif effort is not None:
        body["output_config"] = {"effort": effort}
    if c.temperature is not None and "thinking" not in body:  # thinking rejects a temperature (400)
        body["temperature"] = c.temperature
    headers = {"anthropic-version": ANTHROPIC_VERSION, **auth_headers("x-api-key", c._api_key)}
    return f"{c.base_url}/messages", headers, body


def anthropic_reply(data: dict) -> Reply:
    blocks = [b for b in data.get("content") or [] if isinstance(b, dict)]
    text = "".join(b.get("text") or "" for b in blocks if b.get("type") == "text")
    reasoning = "".join(b.get("thinking") or "" for b in blocks if b.get("type") == "thinking")
    raw = data.get("stop_reason")
    finish = ANTHROPIC_FINISH.get(raw, "other")  # pause_turn and future values: "other"
    u = data.get("usage") or {}
    # Cached prompt tokens are reported apart from input_tokens; thinking is inside output_tokens.
    prompt = sum(u.get(k) or 0 for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"))
    category = (data.get("stop_details") or {}).get("category") or ""
    return Reply(text, reasoning, finish, raw, finish == "length", normal_usage(prompt, u.get("output_tokens")),
                 request_id=data.get("id"), refusal=str(category))


PROVIDERS = {"openai": (openai_request, openai_reply), "gemini": (gemini_request, gemini_reply),
             "anthropic": (anthropic_request, anthropic_reply)}


# ---------------------------------------------------------------------------------- errors on the wire
def snippet(text: str, limit: int = 500) -> str:
    text = " ".join(text.split())
    return (text[:limit] + " ...") if len(text) > limit else (text or "(empty body)")


def parse_json_object(text: str, status: int, headers) -> dict:
    """The 2xx body as a dict; an error envelope inside it raises (OpenRouter sends errors with a 200)."""
    try:
        data = json.loads(text)  # leading keep-alive newlines are whitespace to json
    except ValueError:
        data = None
    if not isinstance(data, dict):
        kind = headers.get("content-type", "no content type")
        raise MalformedResponse(f"HTTP {status} reply is not a JSON object ({kind}): {snippet(text)}", status,
                                retryable=True)
    if data.get("error") or data.get("type") == "error":
        raise in_band_error(data.get("error") or {}, headers)
    return data


def in_band_error(error, headers=None) -> LLMError:
    """An error envelope that arrived with status 200: classify it by its own numeric code, if any."""
    code = error.get("code") if isinstance(error, dict) else None
    status = code if isinstance(code, int) and 400 <= code < 600 else 200
    err = http_error(status, json.dumps({"error": error}), headers or {})
    err.message = f"error inside a 200 reply: {err.message}"
    return err


def error_fields(text: str) -> tuple[str, str, list, str | None]:
    """(message, type, details, request_id) from any known error envelope, or a snippet of anything else."""
    try:
        data = json.loads(text)
    except ValueError:
        return snippet(text), "", [], None
    if isinstance(data, list) and data:  # Gemini's OpenAI endpoint wraps the error in a list
        data = data[0]
    if not isinstance(data, dict):
        return snippet(text), "", [], None
    error = data.get("error", data)  # {"error": {...}}, Anthropic {"type": "error", "error": {...}}, old vLLM
    request_id = data.get("request_id")
    if isinstance(error, str):  # Ollama's native endpoints: {"error": "message"}
        return error, "", [], request_id
    if not isinstance(error, dict):
        return snippet(text), "", [], request_id
    message = error.get("message") or data.get("message") or snippet(text)
    kind = error.get("type") or error.get("status") or ""
    if not kind and isinstance(error.get("code"), str):
        kind = error["code"]
    details = error.get("details") if isinstance(error.get("details"), list) else []
    return str(message), str(kind), details, request_id


def retry_after(headers, details: list) -> float | None:
    """Seconds the server asked us to wait: retry-after-ms, Retry-After (seconds or date), Gemini RetryInfo."""
    try:
        return float(headers["retry-after-ms"]) / 1000
    except (KeyError, TypeError, ValueError):
        pass
    value = headers.get("retry-after")
    if value:
        try:
            return float(value)
        except ValueError:
            pass
        try:
            when = email.utils.parsedate_to_datetime(value)
            return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())
        except (TypeError, ValueError):
            pass
    for d in details:
        if isinstance(d, dict) and str(d.get("@type", "")).endswith("RetryInfo"):
            m = re.fullmatch(r"(\d+(?:\.\d+)?)s", str(d.get("retryDelay", "")))
            if m:
                return float(m.group(1))
    return None


def http_error(status: int, text: str, headers) -> LLMError:
    """Classify by status first, then by the body (llm-apis.md section 6, rule 1)."""
    message, kind, details, body_request_id = error_fields(text)
    low, what = text.lower(), f"{kind} {message}".lower()
    if status == 401 or "api_key_invalid" in low or kind == "authentication_error":
        cls, retryable = AuthError, False  # Gemini reports a bad key as a 400
    elif status in (400, 403) and any(m in what for m in CONTEXT_MARKERS):
        cls, retryable = ContextLengthExceeded, False  # Together reports context overflow as a 403
    elif status == 403:
        cls, retryable = AuthError, False
    elif status == 402 or (status == 429 and any(m in low for m in QUOTA_MARKERS)):
        cls, retryable = QuotaExceeded, False  # waiting does not refill a monthly cap or a daily quota
    elif status == 404:
        cls, retryable = ModelNotFound, False
    elif status == 413:
        cls, retryable = RequestTooLarge, False
    elif status == 429:
        cls, retryable = RateLimited, True
    else:
        cls, retryable = ProviderError, status in (408, 409) or status >= 500  # includes Anthropic's 529
    should_retry = str(headers.get("x-should-retry", "")).lower()
    if should_retry in ("true", "false"):
        retryable = should_retry == "true"
    request_id = headers.get("x-request-id") or headers.get("request-id") or body_request_id
    label = f" [{kind}]" if kind else ""
    if 300 <= status < 400:  # e.g. http -> https: following it would turn the POST into a GET
        label += f" (redirected to {headers.get('location')}: check base_url)"
    return cls(f"{message}{label}", status, retryable, request_id=request_id, error_type=kind,
               retry_after=retry_after(headers, details))

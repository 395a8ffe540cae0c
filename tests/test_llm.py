"""Tests for llm.py against a real scripted HTTP server on 127.0.0.1 (tests/http_fixtures.py), never the network.

Each test checks one property the client promises (llm.py's docstring: wire formats, which failures are
retried and how, the deadline, key redaction, typed errors); a number in a comment is the case it covers in
the list of provider behaviours the client was written against. Sleeps are injected, so retry tests are
instant; only the deadline and timeout tests wait, about 1.5 s in all.  Run: python3 -m pytest -q tests/test_llm.py
"""
from __future__ import annotations

import email.utils
import json
import logging
import socket
import time

import pytest

import llm
from http_fixtures import ScriptedServer

KEY = "sk-test-0123456789abcdef-SECRET"
PREFIX = {"openai": "/v1", "gemini": "/v1beta", "anthropic": "/v1"}
MODEL = {"openai": "gpt-4o-mini", "gemini": "gemini-2.5-pro", "anthropic": "claude-sonnet-4-5"}
PATH = {"openai": "/v1/chat/completions", "gemini": "/v1beta/models/gemini-2.5-pro:generateContent",
        "anthropic": "/v1/messages"}


@pytest.fixture
def server():
    s = ScriptedServer()
    yield s
    s.close()


def make(server, provider="openai", **kw):
    """A client pointed at the test server; its sleeps are recorded in client.sleeps instead of slept."""
    sleeps: list[float] = []
    kw.setdefault("api_key", KEY)
    kw.setdefault("sleep", sleeps.append)
    client = llm.Client(provider, MODEL[provider], server.url + PREFIX[provider], **kw)
    client.sleeps = sleeps
    return client


def openai_body(content="Hello!", finish="stop", usage=None, **message):
    return {"id": "chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT", "object": "chat.completion", "created": 1741569952,
            "model": "gpt-4o-mini-2024-07-18",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content, "refusal": None,
                                                 **message}, "logprobs": None, "finish_reason": finish}],
            "usage": usage if usage is not None else {
                "prompt_tokens": 19, "completion_tokens": 10, "total_tokens": 29,
                "prompt_tokens_details": {"cached_tokens": 0},
                "completion_tokens_details": {"reasoning_tokens": 0}}}


def gemini_body(parts=({"text": "Hello!"},), finish="STOP", usage=None):
    content = {"role": "model", "parts": list(parts)} if parts is not None else {"role": "model"}
    return {"candidates": [{"content": content, "finishReason": finish, "index": 0}],
            "usageMetadata": usage if usage is not None else {
                "promptTokenCount": 12, "candidatesTokenCount": 5, "thoughtsTokenCount": 40,
                "totalTokenCount": 57},
            "modelVersion": "gemini-2.5-pro", "responseId": "resp-gem-1"}


def anthropic_body(content=({"type": "text", "text": "Hello!"},), stop="end_turn", usage=None, **extra):
    return {"id": "msg_01XFDUDYJgAACzvnptvVoYEL", "type": "message", "role": "assistant",
            "model": "claude-sonnet-4-5", "content": list(content), "stop_reason": stop, "stop_sequence": None,
            "usage": usage if usage is not None else {
                "input_tokens": 20, "output_tokens": 8, "cache_creation_input_tokens": 3,
                "cache_read_input_tokens": 5},
            **extra}


SUCCESS = {"openai": openai_body, "gemini": gemini_body, "anthropic": anthropic_body}
OPENAI_429 = {"error": {"message": "Rate limit reached for gpt-4o-mini on requests per min (RPM): Limit 3, "
                                   "Used 3, Requested 1. Please try again in 20s.",
                        "type": "requests", "param": None, "code": "rate_limit_exceeded"}}
ANTHROPIC_529 = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"},
                 "request_id": "req_011CSHoEeqs5C35K2UUqR7Fy"}
GEMINI_503 = {"error": {"code": 503, "message": "The model is overloaded. Please try again later.",
                        "status": "UNAVAILABLE"}}


def gemini_429(quota_id="GenerateRequestsPerMinutePerProjectPerModel-FreeTier", delay="38s"):
    return {"error": {"code": 429, "status": "RESOURCE_EXHAUSTED",
                      "message": "You exceeded your current quota, please check your plan and billing details. "
                                 "Please retry in 38.86s.",
                      "details": [{"@type": "type.googleapis.com/google.rpc.QuotaFailure",
                                   "violations": [{"quotaMetric": "generativelanguage.googleapis.com/"
                                                                  "generate_content_free_tier_requests",
                                                   "quotaId": quota_id}]},
                                  {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": delay}]}}


# ------------------------------------------------------------------------------------- success (cases 1, 7)
def test_openai_success_returns_content_usage_and_request_id(server):  # case 1
    server.add(200, openai_body("Hello there, how may I assist you today?"), {"x-request-id": "req_abc"})
    client = make(server)
    assert client("hi") == "Hello there, how may I assist you today?"
    last = client.last
    assert (last.finish, last.raw_finish, last.truncated, last.status) == ("stop", "stop", False, 200)
    assert last.usage == {"input": 19, "output": 10, "reasoning": 0, "total": 29}
    assert last.request_id == "req_abc"
    assert len(server.requests) == 1
    assert client.usage == dict(calls=1, prompt_tokens=19, completion_tokens=10, reasoning_tokens=0,
                                total_tokens=29, retries=0, failures=0)


def test_gemini_success_joins_text_parts_and_counts_thoughts(server):
    server.add(200, gemini_body([{"text": "def f():"}, {"text": "\n    pass"}]))
    client = make(server, "gemini")
    assert client("hi") == "def f():\n    pass"
    # thoughts are output the model was billed for, so they count in completion_tokens and apart
    assert client.last.usage == {"input": 12, "output": 45, "reasoning": 40, "total": 57}
    assert client.last.request_id == "resp-gem-1"


def test_anthropic_success_joins_text_blocks_and_counts_cached_input(server):
    server.add(200, anthropic_body([{"type": "text", "text": "A"}, {"type": "text", "text": "B"}]),
               {"request-id": "req_011C"})
    client = make(server, "anthropic")
    assert client("hi") == "AB"
    assert client.last.usage == {"input": 28, "output": 8, "reasoning": 0, "total": 36}
    assert client.last.request_id == "req_011C"


@pytest.mark.parametrize("provider,body,reasoning", [
    ("openai", openai_body("42", reasoning="vLLM thinks"), "vLLM thinks"),
    ("openai", openai_body("42", reasoning_content="DeepSeek thinks"), "DeepSeek thinks"),
    ("openai", openai_body("42", reasoning="", reasoning_content="old vLLM thinks"), "old vLLM thinks"),
    ("anthropic", anthropic_body([{"type": "thinking", "thinking": "Claude thinks", "signature": "sig"},
                                  {"type": "redacted_thinking", "data": "opaque"},
                                  {"type": "text", "text": "42"}]), "Claude thinks"),
    ("gemini", gemini_body([{"text": "Gemini thinks", "thought": True}, {"thoughtSignature": "c2ln"},
                            {"text": "42"}]), "Gemini thinks"),
])
def test_reasoning_is_kept_out_of_the_answer(server, provider, body, reasoning):  # case 7
    server.add(200, body)
    client = make(server, provider)
    assert client("q") == "42"
    assert client.last.reasoning == reasoning


# ------------------------------------------------------------------------------------- request shape (case 2)
def test_openai_request_shape(server):
    server.add(200, openai_body())
    client = make(server, temperature=0.7, max_output_tokens=512, reasoning_effort="low")
    client.chat([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}])
    req = server.requests[0]
    assert req.path == PATH["openai"]
    assert req.headers["authorization"] == f"Bearer {KEY}"
    assert req.headers["content-type"] == "application/json"
    assert req.json == {"model": "gpt-4o-mini", "temperature": 0.7, "max_tokens": 512, "reasoning_effort": "low",
                        "messages": [{"role": "system", "content": "Be brief."},
                                     {"role": "user", "content": "hi"}]}


def test_hosted_openai_gets_max_completion_tokens_and_compatible_servers_max_tokens():
    msgs = [{"role": "user", "content": "hi"}]
    _, _, hosted = llm.openai_request(llm.Client("openai", "o3", api_key=KEY, max_output_tokens=100), msgs)
    _, _, local = llm.openai_request(
        llm.Client("openai", "qwen3", "http://localhost:11434/v1", max_output_tokens=100), msgs)
    assert hosted["max_completion_tokens"] == 100 and "max_tokens" not in hosted
    assert local["max_tokens"] == 100 and "max_completion_tokens" not in local
    _, _, default = llm.openai_request(llm.Client("openai", "o3", api_key=KEY), msgs)
    assert set(default) == {"model", "messages"}  # nothing optional is sent unless asked for


@pytest.mark.parametrize("provider", ["openai", "gemini", "anthropic"])
def test_no_key_sends_no_auth_header(server, provider):
    server.add(200, SUCCESS[provider]())
    make(server, provider, api_key=None)("hi")
    headers = server.requests[0].headers
    assert not {"authorization", "x-api-key", "x-goog-api-key"} & set(headers)


def test_gemini_request_shape(server):
    server.add(200, gemini_body())
    client = make(server, "gemini", temperature=0.2, max_output_tokens=1024, reasoning_effort=2048)
    client.chat([{"role": "system", "content": "You write CUDA."}, {"role": "user", "content": "a"},
                 {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}])
    req = server.requests[0]
    assert req.path == PATH["gemini"] and req.query == ""  # the key is never in the URL
    assert req.headers["x-goog-api-key"] == KEY and "authorization" not in req.headers
    assert req.json == {
        "systemInstruction": {"parts": [{"text": "You write CUDA."}]},
        "contents": [{"role": "user", "parts": [{"text": "a"}]}, {"role": "model", "parts": [{"text": "b"}]},
                     {"role": "user", "parts": [{"text": "c"}]}],
        "generationConfig": {"temperature": 0.2, "maxOutputTokens": 1024, "thinkingConfig": {"thinkingBudget": 2048}}}


def test_gemini_effort_level_sends_thinking_level_only(server):
    server.add(200, gemini_body())
    make(server, "gemini", reasoning_effort="high")("hi")
    assert server.requests[0].json["generationConfig"] == {"thinkingConfig": {"thinkingLevel": "HIGH"}}


def test_anthropic_request_shape(server):
    server.add(200, anthropic_body())
    client = make(server, "anthropic", temperature=0.5)
    client.chat([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}])
    req = server.requests[0]
    assert req.path == PATH["anthropic"]
    assert req.headers["x-api-key"] == KEY and req.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in req.headers
    assert req.json == {"model": "claude-sonnet-4-5", "max_tokens": 8192, "system": "Be brief.",
                        "temperature": 0.5, "messages": [{"role": "user", "content": "hi"}]}


def test_anthropic_thinking_budget_drops_temperature(server):
    server.add(200, anthropic_body())
    make(server, "anthropic", temperature=0.5, max_output_tokens=16000, reasoning_effort=4096)("hi")
    body = server.requests[0].json
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 4096} and body["max_tokens"] == 16000
    assert "temperature" not in body


# ------------------------------------------------------------------------------ truncation and empty (3-6)
@pytest.mark.parametrize("provider,body", [
    ("openai", openai_body("def f(x):\n    return", finish="length")),
    ("gemini", gemini_body([{"text": "def f(x):\n    return"}], finish="MAX_TOKENS")),
    ("anthropic", anthropic_body([{"type": "text", "text": "def f(x):\n    return"}], stop="max_tokens")),
])
def test_truncated_reply_returns_its_text_marked_truncated(server, provider, body):  # case 3
    server.add(200, body)
    client = make(server, provider)
    assert client("q") == "def f(x):\n    return"
    assert client.last.truncated and client.last.finish == "length"
    assert len(server.requests) == 1


@pytest.mark.parametrize("provider,body,reasoning_tokens", [
    ("openai", openai_body("", finish="length", usage={  # OpenAI reasoning model: the budget went on reasoning
        "prompt_tokens": 30, "completion_tokens": 256, "total_tokens": 286,
        "completion_tokens_details": {"reasoning_tokens": 256}}), 256),
    ("openai", openai_body(None, finish="length", reasoning="still thinking ..."), 0),  # vLLM
    ("gemini", gemini_body(None, finish="MAX_TOKENS", usage={  # Gemini 2.5: no parts at all
        "promptTokenCount": 10, "thoughtsTokenCount": 1021, "totalTokenCount": 1031}), 1021),
])
def test_reasoning_that_used_the_whole_budget_raises_truncated_output(server, provider, body, reasoning_tokens):
    server.add(200, body)  # case 4
    client = make(server, provider)
    with pytest.raises(llm.TruncatedOutput) as info:
        client("q")
    assert not isinstance(info.value, llm.ContentBlocked) and not info.value.retryable
    assert client.last.truncated and client.last.finish == "length"
    assert client.usage["reasoning_tokens"] == reasoning_tokens
    assert len(server.requests) == 1


@pytest.mark.parametrize("provider,body", [
    ("openai", openai_body(None, finish="tool_calls", tool_calls=[  # case 5
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}])),
    ("openai", {**openai_body(), "choices": []}),  # case 6
    ("anthropic", anthropic_body([], stop="end_turn")),
    ("gemini", {"candidates": [], "usageMetadata": {"promptTokenCount": 3}}),
])
def test_reply_without_answer_text_raises_empty_response(server, provider, body):
    server.add(200, body)
    client = make(server, provider)
    with pytest.raises(llm.EmptyResponse) as info:
        client("q")
    assert type(info.value) is llm.EmptyResponse
    assert len(server.requests) == 1


# --------------------------------------------------------------------------------- blocked output (8-10)
@pytest.mark.parametrize("reason", ["SAFETY", "RECITATION"])
def test_gemini_blocked_output_raises_content_blocked(server, reason):  # case 8
    server.add(200, {"candidates": [{"finishReason": reason, "index": 0,
                                     "safetyRatings": [{"category": "HARM_CATEGORY_HARASSMENT",
                                                        "probability": "HIGH", "blocked": True}]}]})
    client = make(server, "gemini")
    with pytest.raises(llm.ContentBlocked) as info:
        client("q")
    assert info.value.error_type == reason and client.last.finish == "content_filter"
    assert len(server.requests) == 1


def test_gemini_blocked_prompt_raises_prompt_blocked(server):  # case 9
    server.add(200, {"promptFeedback": {"blockReason": "OTHER"},
                     "usageMetadata": {"promptTokenCount": 7, "totalTokenCount": 7}})
    with pytest.raises(llm.PromptBlocked) as info:
        make(server, "gemini")("q")
    assert info.value.error_type == "OTHER" and len(server.requests) == 1


@pytest.mark.parametrize("provider,body,expected", [
    ("openai", openai_body(None, finish="content_filter"), "content_filter"),
    ("openai", openai_body(None, refusal="I'm sorry, I can't help with that."), "can't help"),
    ("anthropic", anthropic_body([], stop="refusal", stop_details={"type": "refusal", "category": "cyber"}),
     "cyber"),
])
def test_filters_and_refusals_raise_content_blocked(server, provider, body, expected):  # case 10
    server.add(200, body)
    with pytest.raises(llm.ContentBlocked, match=expected):
        make(server, provider)("q")
    assert len(server.requests) == 1


# ------------------------------------------------------------------------------------ retries (11-15)
@pytest.mark.parametrize("headers,expected", [
    ({"retry-after-ms": "250"}, 0.25),
    ({"retry-after": "2"}, 2.0),
    ({"retry-after-ms": "1500", "retry-after": "9"}, 1.5),  # the finer header wins
])
def test_rate_limit_hint_is_honoured_then_success(server, headers, expected):  # case 11
    server.add(429, OPENAI_429, headers)
    server.add(200, openai_body())
    client = make(server)
    assert client("q") == "Hello!"
    assert client.sleeps == [expected] and len(server.requests) == 2


def test_retry_after_http_date_is_honoured(server):
    server.add(429, OPENAI_429, {"retry-after": email.utils.formatdate(time.time() + 30, usegmt=True)})
    server.add(200, openai_body())
    client = make(server)
    client("q")
    assert 27 <= client.sleeps[0] <= 31


def test_gemini_retry_info_delay_is_honoured(server):  # case 12
    server.add(429, gemini_429())
    server.add(200, gemini_body())
    client = make(server, "gemini")
    assert client("q") == "Hello!"
    assert client.sleeps == [38.0] and len(server.requests) == 2


@pytest.mark.parametrize("provider,status,body,headers,cls", [
    ("openai", 429, OPENAI_429, {"retry-after": "3600"}, llm.RateLimited),
    ("gemini", 429, gemini_429("GenerateRequestsPerDayPerProjectPerModel-FreeTier", "3s"), {}, llm.QuotaExceeded),
    ("openai", 429, {"error": {"message": "You exceeded your current quota, please check your plan and billing "
                                          "details.", "type": "insufficient_quota", "param": None,
                               "code": "insufficient_quota"}}, {}, llm.QuotaExceeded),
    ("openai", 402, {"error": {"message": "Insufficient Balance", "type": "unknown_error", "param": None,
                               "code": "invalid_request_error"}}, {}, llm.QuotaExceeded),  # DeepSeek
    ("anthropic", 429, {"type": "error", "error": {"type": "rate_limit_error", "message": "spend limit reached",
                                                   "details": {"error_code": "enforced_spend_limit_reached"}}},
     {}, llm.QuotaExceeded),
])
def test_long_waits_and_exhausted_quotas_fail_fast(server, provider, status, body, headers, cls):  # case 13
    server.add(status, body, headers)
    client = make(server, provider)
    with pytest.raises(cls):
        client("q")
    assert client.sleeps == [] and len(server.requests) == 1


@pytest.mark.parametrize("provider,status,body,headers", [
    ("openai", 503, {"error": {"message": "The server is overloaded.", "type": "service_unavailable_error",
                               "param": None, "code": "server_is_overloaded"}}, {}),
    ("openai", 500, {"error": {"message": "The server had an error", "type": "server_error", "param": None,
                               "code": None}}, {}),
    ("openai", 503, {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}, {}),
    ("openai", 502, {"error": {"code": 502, "message": "Bad gateway.", "param": None,
                               "type": "cf_bad_gateway"}}, {}),
    ("openai", 502, "<html><head><title>502 Bad Gateway</title></head><body>cloudflare</body></html>",
     {"Content-Type": "text/html"}),
    ("openai", 504, b"", {}),
    ("openai", 429, {"error": {"code": 429, "message": "Rate limit exceeded: free-models-per-min",
                               "metadata": {"headers": {"X-RateLimit-Limit": "20"}}}}, {}),  # OpenRouter
    ("openai", 408, b"", {}),
    ("anthropic", 529, ANTHROPIC_529, {}),
    ("gemini", 503, GEMINI_503, {}),
])
def test_transient_errors_are_retried_with_backoff(server, provider, status, body, headers):  # case 14, 18, 19
    server.add(status, body, headers)
    server.add(200, SUCCESS[provider]())
    client = make(server, provider)
    assert client("q") == "Hello!"
    assert len(server.requests) == 2 and len(client.sleeps) == 1
    assert 0.375 <= client.sleeps[0] <= 0.5  # first backoff 0.5 s minus up to 25% jitter
    assert client.usage["retries"] == 1 and client.usage["failures"] == 0


def test_retries_are_exhausted_after_exactly_one_plus_max_retries(server):  # case 15
    for _ in range(3):
        server.add(529, ANTHROPIC_529, {"request-id": "req_011CSHoEeqs5C35K2UUqR7Fy"})
    client = make(server, "anthropic")
    with pytest.raises(llm.ProviderError) as info:
        client("q")
    err = info.value
    assert len(server.requests) == 3
    assert (err.status, err.error_type, err.request_id, err.provider) == (
        529, "overloaded_error", "req_011CSHoEeqs5C35K2UUqR7Fy", "anthropic")
    assert "Overloaded" in str(err) and "HTTP 529" in str(err)
    assert 0.375 <= client.sleeps[0] <= 0.5 and 0.75 <= client.sleeps[1] <= 1.0
    assert client.usage == dict(calls=1, prompt_tokens=0, completion_tokens=0, reasoning_tokens=0,
                                total_tokens=0, retries=2, failures=1)


def test_max_retries_zero_makes_one_request(server):
    server.add(503, GEMINI_503)
    with pytest.raises(llm.ProviderError):
        make(server, "gemini", max_retries=0)("q")
    assert len(server.requests) == 1


@pytest.mark.parametrize("provider,status,body,cls,fragment", [
    ("openai", 400, {"error": {"message": "This model's maximum context length is 128000 tokens. However, your "
                                          "messages resulted in 130000 tokens.", "type": "invalid_request_error",
                               "param": "messages", "code": "context_length_exceeded"}},
     llm.ContextLengthExceeded, "maximum context length"),
    ("openai", 400, {"object": "error", "message": "This model's maximum context length is 4096 tokens.",
                     "type": "BadRequestError", "param": None, "code": 400},  # old vLLM, top level
     llm.ContextLengthExceeded, "4096 tokens"),
    ("openai", 400, {"error": {"code": 400, "message": "the request exceeds the available context size",
                               "type": "exceed_context_size_error", "n_prompt_tokens": 9000, "n_ctx": 8192}},
     llm.ContextLengthExceeded, "available context size"),  # llama.cpp
    ("openai", 403, {"error": {"message": "Input tokens plus max_tokens exceed the model's context length",
                               "type": "invalid_request_error"}}, llm.ContextLengthExceeded, "context length"),
    ("openai", 401, {"error": {"message": "Incorrect API key provided: sk-PMafP***E873.",
                               "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}},
     llm.AuthError, "Incorrect API key"),
    ("openai", 403, {"error": {"code": "unsupported_country_region_territory", "message": "Country, region, or "
                               "territory not supported", "param": None, "type": "request_forbidden"}},
     llm.AuthError, "not supported"),
    ("openai", 404, {"error": {"message": "The model `gpt-9` does not exist or you do not have access to it.",
                               "type": "invalid_request_error", "param": None, "code": "model_not_found"}},
     llm.ModelNotFound, "gpt-9"),
    ("openai", 404, {"error": "model 'llama9' not found"}, llm.ModelNotFound, "llama9"),  # Ollama native
    ("openai", 422, {"error": {"message": "Invalid parameter: top_p", "type": "invalid_request_error"}},
     llm.ProviderError, "top_p"),
    ("openai", 400, [{"error": {"code": 400, "message": "Invalid JSON payload received. Unknown name \"foo\"",
                                "status": "INVALID_ARGUMENT"}}], llm.ProviderError, "Unknown name"),  # Gemini compat
    ("openai", 413, "<html><body><h1>413 Request Entity Too Large</h1><hr>nginx</body></html>",
     llm.RequestTooLarge, "413 Request Entity Too Large"),
    ("anthropic", 413, {"error": {"type": "request_too_large", "message": "Request exceeds the maximum size"}},
     llm.RequestTooLarge, "maximum size"),
    ("anthropic", 400, {"type": "error", "error": {"type": "invalid_request_error",
                                                   "message": "prompt is too long: 210000 tokens > 200000 maximum"},
                        "request_id": "req_x"}, llm.ContextLengthExceeded, "prompt is too long"),
    ("gemini", 400, {"error": {"code": 400, "message": "API key not valid. Please pass a valid API key.",
                               "status": "INVALID_ARGUMENT",
                               "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo",
                                            "reason": "API_KEY_INVALID", "domain": "googleapis.com"}]}},
     llm.AuthError, "API key not valid"),  # case 17
    ("gemini", 404, {"error": {"code": 404, "message": "models/gemini-9 is not found for API version v1beta",
                               "status": "NOT_FOUND"}}, llm.ModelNotFound, "gemini-9"),
])
def test_permanent_errors_make_one_request_and_read_the_envelope(server, provider, status, body, cls, fragment):
    server.add(status, body)  # cases 16-19
    client = make(server, provider)
    with pytest.raises(cls) as info:
        client("q")
    err = info.value
    assert len(server.requests) == 1 and client.sleeps == []
    assert err.status == status and not err.retryable and fragment in str(err)
    assert KEY not in str(err) and KEY not in repr(err)


def test_a_redirect_is_reported_not_followed(server):
    server.add(301, b"", {"Location": "https://example.invalid/v1/chat/completions"})
    with pytest.raises(llm.ProviderError, match="redirected to https://example.invalid.*check base_url"):
        make(server)("q")
    assert len(server.requests) == 1


def test_x_should_retry_header_overrides_the_status(server):
    server.add(503, GEMINI_503, {"x-should-retry": "false"})
    with pytest.raises(llm.ProviderError):
        make(server, "gemini")("q")
    server.add(400, {"error": {"message": "try again"}}, {"x-should-retry": "true"})
    server.add(200, gemini_body())
    assert make(server, "gemini")("q") == "Hello!"
    assert len(server.requests) == 3


def test_a_wait_beyond_the_deadline_fails_fast(server):
    server.add(429, OPENAI_429, {"retry-after": "10"})
    client = make(server, deadline_s=5)
    with pytest.raises(llm.RateLimited, match="over max_retry_wait_s or the deadline"):
        client("q")
    assert client.sleeps == [] and len(server.requests) == 1


# ------------------------------------------------------------------------ 2xx that are not answers (20, 21)
@pytest.mark.parametrize("body,content_type,fragment", [
    ("<html><body>Please log in to the hotel Wi-Fi</body></html>", "text/html", "hotel Wi-Fi"),
    ('{"id": "chatcmpl-1", "choices": [{"message": {"content": "def f', "application/json", "chatcmpl-1"),
])
def test_a_200_that_is_not_json_raises_malformed_response(server, body, content_type, fragment):  # case 20
    server.add(200, body, {"Content-Type": content_type})
    server.add(200, body, {"Content-Type": content_type})
    client = make(server, max_retries=1)
    with pytest.raises(llm.MalformedResponse) as info:
        client("q")
    assert content_type in str(info.value) and fragment in str(info.value) and info.value.status == 200
    assert len(server.requests) == 2


def test_error_inside_a_200_is_raised_and_retried_by_its_code(server):  # case 21 (OpenRouter)
    server.add(200, {"error": {"code": 502, "message": "Provider returned error", "metadata": {"raw": "boom"}}})
    server.add(200, {**openai_body(), "choices": [{"index": 0, "finish_reason": "error",
                                                   "message": {"role": "assistant", "content": ""},
                                                   "error": {"code": 429, "message": "upstream rate limited"}}]})
    server.add(200, openai_body("finally"))
    client = make(server)
    assert client("q") == "finally" and len(server.requests) == 3


def test_error_inside_a_200_with_a_client_code_is_not_retried(server):
    server.add(200, {"error": {"code": 400, "message": "Invalid model"}})
    with pytest.raises(llm.ProviderError, match="error inside a 200 reply: Invalid model") as info:
        make(server)("q")
    assert info.value.status == 400 and len(server.requests) == 1


# ------------------------------------------------------------------------- transport and deadline (22, 23)
def test_keepalive_newlines_before_the_json_are_ignored(server):  # case 22 (DeepSeek under load)
    server.add(200, b"\n\n\n" + json.dumps(openai_body("ok")).encode(),
               {"Content-Type": "application/json"})
    assert make(server)("q") == "ok"


def test_a_server_trickling_newlines_is_stopped_by_the_deadline(server):
    server.add(200, behaviour="trickle", headers={"Content-Type": "application/json"})
    client = make(server, deadline_s=1.0, timeout_s=5.0)  # the read timeout alone would never fire
    start = time.monotonic()
    with pytest.raises(llm.DeadlineExceeded):
        client("q")
    assert time.monotonic() - start < 2.0
    assert len(server.requests) == 1 and client.usage["failures"] == 1


def test_a_closed_port_is_a_transport_error_after_retries():  # case 23
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sleeps: list[float] = []
    client = llm.Client("openai", "m", f"http://127.0.0.1:{port}/v1", sleep=sleeps.append)
    with pytest.raises(llm.TransportError) as info:
        client("q")
    assert info.value.status is None and info.value.retryable and len(sleeps) == 2


def test_a_dropped_connection_is_retried(server):
    server.add(behaviour="close")
    server.add(200, openai_body())
    client = make(server)
    assert client("q") == "Hello!" and len(server.requests) == 2 and len(client.sleeps) == 1


def test_a_read_timeout_is_retried(server):
    server.add(200, openai_body("late"), delay_s=0.6)
    server.add(200, openai_body("on time"))
    client = make(server, timeout_s=0.2)
    assert client("q") == "on time" and len(client.sleeps) == 1


# --------------------------------------------------------------------------- enums and usage (24, 25)
@pytest.mark.parametrize("provider,body,raw", [
    ("openai", openai_body("partial", finish="abort"), "abort"),
    ("gemini", gemini_body([{"text": "partial"}], finish="NEW_VALUE"), "NEW_VALUE"),
    ("anthropic", anthropic_body([{"type": "text", "text": "partial"}], stop="pause_turn"), "pause_turn"),
])
def test_unknown_finish_values_map_to_other(server, provider, body, raw):
    server.add(200, body)
    client = make(server, provider)
    assert client("q") == "partial"
    assert (client.last.finish, client.last.raw_finish, client.last.truncated) == ("other", raw, False)


@pytest.mark.parametrize("provider,body,usage", [
    ("gemini", gemini_body(usage={"promptTokenCount": 10, "thoughtsTokenCount": 5, "totalTokenCount": 30}),
     {"input": 10, "output": 5, "reasoning": 5, "total": 30}),  # no candidatesTokenCount; total as reported
    ("openai", {k: v for k, v in openai_body().items() if k != "usage"},
     {"input": 0, "output": 0, "reasoning": 0, "total": 0}),
    ("anthropic", anthropic_body(usage={"input_tokens": 4}), {"input": 4, "output": 0, "reasoning": 0, "total": 4}),
])
def test_usage_edge_cases_never_crash(server, provider, body, usage):
    server.add(200, body)
    client = make(server, provider)
    client("q")
    assert client.last.usage == usage


def test_usage_accumulates_over_calls_retries_and_failures(server):
    server.add(200, openai_body())
    server.add(503, {"error": {"message": "overloaded"}})
    server.add(200, openai_body())
    server.add(200, openai_body("", finish="length", usage={"prompt_tokens": 5, "completion_tokens": 7,
                                                           "completion_tokens_details": {"reasoning_tokens": 7}}))
    client = make(server)
    client("a")
    client("b")
    with pytest.raises(llm.TruncatedOutput):
        client("c")
    assert client.usage == dict(calls=3, prompt_tokens=43, completion_tokens=27, reasoning_tokens=7,
                                total_tokens=70, retries=1, failures=1)


# ----------------------------------------------------------------------------------- secrets (case 16)
def test_the_api_key_never_appears_in_errors_repr_or_logs(server, caplog):
    echo = {"error": {"message": f"Incorrect API key provided: {KEY}", "type": "invalid_request_error"}}
    server.add(503, {"error": {"message": f"overloaded for key {KEY}"}})
    server.add(401, echo)
    client = make(server)
    with caplog.at_level(logging.DEBUG, logger="llm"), pytest.raises(llm.AuthError) as info:
        client("q")
    assert "overloaded for key [redacted]" in caplog.text  # the retry was logged, scrubbed
    for text in (str(info.value), repr(info.value), info.value.message, repr(client), caplog.text):
        assert KEY not in text
    assert "[redacted]" in str(info.value)


@pytest.mark.parametrize("key", ["x", "EMPTY", "dummy", "sk-no-key-required"])
def test_a_placeholder_key_changes_no_reply_and_no_error(server, key):
    """Local servers are often given "x" or "EMPTY": nothing is a secret then, and every reply reaches the
    search exactly as sent (a scrubbed "x" once broke "Experiment:" lines)."""
    text = "Idea: fuse the max and exp.\nChoice: proposal 1\nExperiment: unroll x4; EMPTY dummy blocks stay\n"
    server.add(200, openai_body(text))
    server.add(400, {"error": {"message": "max_tokens exceeds the context: x EMPTY dummy", "type": "invalid"}})
    client = make(server, api_key=key)
    assert client(text) == text and client.last.text == text
    with pytest.raises(llm.ProviderError) as info:
        client("again")
    assert "max_tokens exceeds the context: x EMPTY dummy" in str(info.value)
    assert client.redact(f"a {key} b") == f"a {key} b"


def test_a_real_key_is_scrubbed_from_errors_but_a_reply_that_holds_it_arrives_whole(server, caplog):
    reply = f"Experiment: read the key {KEY} from the environment\n"
    server.add(200, openai_body(reply))
    client = make(server)
    assert client("q") == reply                                        # content the search uses: untouched
    assert client.redact(f"key={KEY}; next") == "key=[redacted]; next"    # what logs and transcripts use
    assert llm.redact(f"{KEY}{KEY}", KEY) == "[redacted][redacted]"
    assert llm.redact("sk-test-0123456789", "sk-test-0123456789abcdef") == "sk-test-0123456789"   # no prefix


def test_the_transcript_never_holds_a_real_key_though_the_search_gets_the_reply_whole(server, tmp_path):
    from driver import transcript
    reply = f"Experiment: read {KEY} from the environment\nx = 1\n"
    server.add(200, openai_body(reply))
    client = make(server)
    book = transcript.Transcript()
    book.attach(tmp_path)
    assert book.recorder(client, client, role="main")(f"prompt with {KEY}", purpose="selection") == reply
    written = (tmp_path / transcript.FILE).read_text()
    assert KEY not in written and "[redacted]" in written and "x = 1" in written


# -------------------------------------------------------------------------------------- configuration
@pytest.mark.parametrize("model,env,provider,key", [
    ("gpt-4o", {"OPENAI_API_KEY": "sk-o"}, "openai", "sk-o"),
    ("o3-mini", {"OPENAI_API_KEY": "sk-o"}, "openai", "sk-o"),
    ("gemini-2.5-pro", {"GOOGLE_API_KEY": "g-key"}, "gemini", "g-key"),
    ("gemini-2.5-flash", {"GEMINI_API_KEY": "gem", "GOOGLE_API_KEY": "g-key"}, "gemini", "gem"),
    ("claude-sonnet-4-5", {"ANTHROPIC_API_KEY": "sk-ant"}, "anthropic", "sk-ant"),
    ("qwen2.5-coder:32b", {"OPENAI_BASE_URL": "http://localhost:11434/v1"}, "openai", None),
])
def test_from_env_picks_the_provider_and_key(monkeypatch, model, env, provider, key):
    for var in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "GEMINI_API_KEY", "GOOGLE_API_KEY", "ANTHROPIC_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    client = llm.Client.from_env(model)
    assert client.provider == provider and client._api_key == key
    if "OPENAI_BASE_URL" in env:
        assert client.base_url == env["OPENAI_BASE_URL"]


def test_from_env_with_a_base_url_talks_to_a_local_server_without_a_key(server, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    server.add(200, openai_body("local"))
    client = llm.Client.from_env("anthropic/claude-3-haiku", base_url=server.url + "/v1")
    assert client.provider == "openai" and client("q") == "local"
    assert "authorization" not in server.requests[0].headers


def test_from_env_without_a_key_or_with_an_unknown_model_raises(monkeypatch):
    for var in ("OPENAI_BASE_URL", "GEMINI_API_KEY", "GOOGLE_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(llm.AuthError, match="GEMINI_API_KEY or GOOGLE_API_KEY"):
        llm.Client.from_env("gemini-2.5-pro")
    with pytest.raises(ValueError, match="provider"):
        llm.Client.from_env("mystery-model")


@pytest.mark.parametrize("messages", [[], [{"role": "tool", "content": "x"}], [{"role": "user", "content": None}]])
def test_malformed_messages_raise_value_error(messages):
    with pytest.raises(ValueError):
        llm.Client("openai", "m", "http://127.0.0.1:9/v1").chat(messages)

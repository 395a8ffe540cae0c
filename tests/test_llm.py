"""Tests for llm.py against a real scripted HTTP server on 127.0.0.1 (tests/http_fixtures.py), never the network.

Each test checks one property the client promises (llm.py's docstring: wire formats, which failures are
retried and how, the deadline, key redaction, typed errors), with replies and errors shaped as each provider
sends them. Sleeps are injected, so retry tests are instant; only the deadline and timeout tests wait, about
1.5 s in all. Where the API key comes from and where it never goes: test_llm_keys.py.
Run: python3 -m pytest -q tests/test_llm.py
"""
from __future__ import annotations

import email.utils
import json
import socket
import time

import pytest

import llm
from llm_replies import (ANTHROPIC_529, GEMINI_503, KEY, OPENAI_429, PATH, SUCCESS, anthropic_body, gemini_429,
                         gemini_body, make, openai_body, server)  # noqa: F401 (server: a fixture)


# -------------------------------------------------------------------------------------------------- success
def test_openai_success_returns_content_usage_and_request_id(server):
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
def test_reasoning_is_kept_out_of_the_answer(server, provider, body, reasoning):
    server.add(200, body)
    client = make(server, provider)
    assert client("q") == "42"
    assert client.last.reasoning == reasoning


# ---------------------------------------------------------------------------------------------- request shape
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


# ------------------------------------------------------------------------------------ truncation and empty
@pytest.mark.parametrize("provider,body", [
    ("openai", openai_body("def f(x):\n    return", finish="length")),
    ("gemini", gemini_body([{"text": "def f(x):\n    return"}], finish="MAX_TOKENS")),
    ("anthropic", anthropic_body([{"type": "text", "text": "def f(x):\n    return"}], stop="max_tokens")),
])
def test_truncated_reply_returns_its_text_marked_truncated(server, provider, body):
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
    server.add(200, body)
    client = make(server, provider)
    with pytest.raises(llm.TruncatedOutput) as info:
        client("q")
    assert not isinstance(info.value, llm.ContentBlocked) and not info.value.retryable
    assert client.last.truncated and client.last.finish == "length"
    assert client.usage["reasoning_tokens"] == reasoning_tokens
    assert len(server.requests) == 1


@pytest.mark.parametrize("provider,body", [
    ("openai", openai_body(None, finish="tool_calls", tool_calls=[
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}])),
    ("openai", {**openai_body(), "choices": []}),
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


# ---------------------------------------------------------------------------------------- blocked output
@pytest.mark.parametrize("reason", ["SAFETY", "RECITATION"])
def test_gemini_blocked_output_raises_content_blocked(server, reason):
    server.add(200, {"candidates": [{"finishReason": reason, "index": 0,
                                     "safetyRatings": [{"category": "HARM_CATEGORY_HARASSMENT",
                                                        "probability": "HIGH", "blocked": True}]}]})
    client = make(server, "gemini")
    with pytest.raises(llm.ContentBlocked) as info:
        client("q")
    assert info.value.error_type == reason and client.last.finish == "content_filter"
    assert len(server.requests) == 1


def test_gemini_blocked_prompt_raises_prompt_blocked(server):
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
def test_filters_and_refusals_raise_content_blocked(server, provider, body, expected):
    server.add(200, body)
    with pytest.raises(llm.ContentBlocked, match=expected):
        make(server, provider)("q")
    assert len(server.requests) == 1


# -------------------------------------------------------------------------------------------- retries
@pytest.mark.parametrize("headers,expected", [
    ({"retry-after-ms": "250"}, 0.25),
    ({"retry-after": "2"}, 2.0),
    ({"retry-after-ms": "1500", "retry-after": "9"}, 1.5),  # the finer header wins
])
def test_rate_limit_hint_is_honoured_then_success(server, headers, expected):
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


def test_gemini_retry_info_delay_is_honoured(server):
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
def test_long_waits_and_exhausted_quotas_fail_fast(server, provider, status, body, headers, cls):
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
def test_transient_errors_are_retried_with_backoff(server, provider, status, body, headers):
    server.add(status, body, headers)
    server.add(200, SUCCESS[provider]())
    client = make(server, provider)
    assert client("q") == "Hello!"
    assert len(server.requests) == 2 and len(client.sleeps) == 1
    assert 0.375 <= client.sleeps[0] <= 0.5  # first backoff 0.5 s minus up to 25% jitter
    assert client.usage["retries"] == 1 and client.usage["failures"] == 0


def test_retries_are_exhausted_after_exactly_one_plus_max_retries(server):
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
     llm.AuthError, "API key not valid"),
    ("gemini", 404, {"error": {"code": 404, "message": "models/gemini-9 is not found for API version v1beta",
                               "status": "NOT_FOUND"}}, llm.ModelNotFound, "gemini-9"),
])
def test_permanent_errors_make_one_request_and_read_the_envelope(server, provider, status, body, cls, fragment):
    server.add(status, body)
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


# --------------------------------------------------------------------------------- 2xx that are not answers
@pytest.mark.parametrize("body,content_type,fragment", [
    ("<html><body>Please log in to the hotel Wi-Fi</body></html>", "text/html", "hotel Wi-Fi"),
    ('{"id": "chatcmpl-1", "choices": [{"message": {"content": "def f', "application/json", "chatcmpl-1"),
])
def test_a_200_that_is_not_json_raises_malformed_response(server, body, content_type, fragment):
    server.add(200, body, {"Content-Type": content_type})
    server.add(200, body, {"Content-Type": content_type})
    client = make(server, max_retries=1)
    with pytest.raises(llm.MalformedResponse) as info:
        client("q")
    assert content_type in str(info.value) and fragment in str(info.value) and info.value.status == 200
    assert len(server.requests) == 2


def test_error_inside_a_200_is_raised_and_retried_by_its_code(server):  # as OpenRouter sends it
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


# ---------------------------------------------------------------------------------- transport and deadline
def test_keepalive_newlines_before_the_json_are_ignored(server):  # as DeepSeek sends it under load
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


def test_a_closed_port_is_a_transport_error_after_retries():
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


# ------------------------------------------------------------------------------------ enums and usage
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

"""The providers' replies as they send them, and a client pointed at the scripted HTTP server on 127.0.0.1
(tests/http_fixtures.py), shared by the LLM client's tests (test_llm.py, test_llm_keys.py)."""
from __future__ import annotations

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

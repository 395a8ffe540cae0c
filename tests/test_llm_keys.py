"""The LLM client's API key (llm.py): never in an error, a repr, a log or a transcript, though a reply that holds
it reaches the search whole; a placeholder key ("x", "EMPTY") is no secret; which provider and key a model name
and the environment give; malformed messages refused. Against the scripted HTTP server on 127.0.0.1, never the
network.  Run: python3 -m pytest -q tests/test_llm_keys.py
"""
from __future__ import annotations

import logging

import pytest

import llm
from llm_replies import KEY, make, openai_body, server  # noqa: F401 (server: a fixture)


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

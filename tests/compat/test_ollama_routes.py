"""The Ollama routes over the reference backend: model listings, chat and generate through the
``/v1`` inference path, ``keep_alive`` on deployment residency, and Ollama's error shape."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import falcon.testing
import pytest

from tests.compat.conftest import KEY
from tests.test_hardening import HOSTILE_BODIES
from werk_host.protocol import CapabilityId, CapabilityStatus
from werk_host.server import Host
from werk_host.testing.hosts import backend_host
from werk_host.testing.reference import CONTEXT_TOKENS, MAX_OUTPUT_TOKENS, MemoryBackendPlugin
from werk_host.testing.reference_base import EXPERIMENTAL_STATE

AUTH = {"Authorization": f"Bearer {KEY}"}
MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "name three colours"},
    {"role": "assistant", "content": "red green blue"},
    {"role": "user", "content": "and three more please"},
]
#: The reference model allows 63 output tokens; Ollama's default (no limit) is admitted as 256.
SHORT = {"num_predict": 8}


@pytest.fixture
def host(tmp_path: Path) -> Iterator[tuple[Host, MemoryBackendPlugin]]:
    """The compat host whose reference backend also reports its reasoning profile (so that
    Ollama's ``think`` finds a verified one)."""
    home = tmp_path / "home"
    home.mkdir()
    statuses = {**EXPERIMENTAL_STATE, CapabilityId.REASONING: CapabilityStatus.SUPPORTED}
    built, plugin = backend_host(home, operator_api_keys=(KEY,), adapter_kwargs={"statuses": statuses})
    try:
        yield built, plugin
    finally:
        built.close()


def _post(client: falcon.testing.TestClient, path: str, body: object) -> falcon.testing.Result:
    return client.simulate_post(path, json=body, headers=AUTH)


def _lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines()]


def _count(client: falcon.testing.TestClient, messages: list[dict[str, Any]]) -> int:
    result = _post(client, "/werk/v1/chat/count_tokens", {"model": "tiny", "messages": messages})
    count: int = result.json["data"]["input_tokens"]
    return count


def _error(result: falcon.testing.Result, status: int) -> str:
    assert result.status_code == status, result.text
    assert set(result.json) == {"error"}, result.json
    message: str = result.json["error"]
    return message


def _state(client: falcon.testing.TestClient) -> str:
    inventory = client.simulate_get("/werk/v1/deployments", headers=AUTH).json["data"]["inventory"]
    state: str = inventory[0]["state"]
    return state


def test_listing_routes(client: falcon.testing.TestClient) -> None:
    tags = client.simulate_get("/api/tags", headers=AUTH).json["models"]
    assert [(m["name"], m["model"]) for m in tags] == [("tiny", "tiny")]
    assert tags[0]["size"] == len(b"not really weights tiny") and len(tags[0]["digest"]) == 64
    assert set(tags[0]["details"].values()) == {None}  # nothing Werk does not know is guessed
    ps = client.simulate_get("/api/ps", headers=AUTH).json["models"]
    assert [(m["name"], m["context_length"], m["expires_at"]) for m in ps] == [("tiny", CONTEXT_TOKENS, None)]
    assert client.simulate_get("/api/version", headers=AUTH).json["version"]
    for name in ("tiny", "tiny:latest"):
        show = _post(client, "/api/show", {"model": name})
        assert show.status_code == 200 and show.json["parameters"] == f"num_ctx {CONTEXT_TOKENS}"
    assert _post(client, "/api/show", {"name": "tiny"}).status_code == 200  # the older field
    assert (
        _error(_post(client, "/api/show", {"model": "tiny:7b"}), 404)
        == 'model "tiny:7b" is not served here (served: tiny)'
    )
    _error(_post(client, "/api/show", {}), 400)


def test_chat_streams_ndjson_by_default_with_exact_counts(client: falcon.testing.TestClient) -> None:
    result = _post(client, "/api/chat", {"model": "tiny:latest", "messages": MESSAGES, "options": {"num_predict": 3}})
    assert result.status_code == 200 and result.headers["content-type"] == "application/x-ndjson"
    assert result.headers["x-werk-deployment"] == "tiny"
    lines = _lines(result.text)
    assert [line["done"] for line in lines] == [False, False, False, True]
    assert "".join(line["message"]["content"] for line in lines) == "and three more"
    last = lines[-1]
    assert last["model"] == "tiny:latest" and last["done_reason"] == "length"
    assert (last["prompt_eval_count"], last["eval_count"]) == (_count(client, MESSAGES), 3)


def test_chat_and_generate_without_streaming(client: falcon.testing.TestClient) -> None:
    chat = _post(client, "/api/chat", {"model": "tiny", "messages": MESSAGES, "stream": False, "options": SHORT})
    assert chat.status_code == 200 and chat.json["message"] == {"role": "assistant", "content": "and three more please"}
    assert chat.json["done"] is True and chat.json["done_reason"] == "stop"
    generated = _post(
        client,
        "/api/generate",
        {"model": "tiny", "system": "s", "prompt": "one two", "stream": False, "options": SHORT},
    )
    assert generated.json["response"] == "one two"
    prompt = [{"role": "system", "content": "s"}, {"role": "user", "content": "one two"}]
    assert generated.json["prompt_eval_count"] == _count(client, prompt)
    raw = _post(
        client,
        "/api/generate",
        {"model": "tiny", "prompt": "<s> one two", "raw": True, "stream": False, "options": SHORT},
    )
    assert raw.json["response"] == "<s> one two" and raw.json["prompt_eval_count"] == 3  # the prompt as it is
    streamed = _lines(_post(client, "/api/generate", {"model": "tiny", "prompt": "one two", "options": SHORT}).text)
    assert "".join(line["response"] for line in streamed) == "one two" and streamed[-1]["done"] is True


def test_counters_count_ollama_requests(client: falcon.testing.TestClient) -> None:
    before = client.simulate_get("/werk/v1/observability", headers=AUTH).json["data"]["chat"]
    _post(client, "/api/chat", {"model": "tiny", "messages": MESSAGES, "options": SHORT})
    _post(client, "/api/chat", {"model": "tiny", "messages": MESSAGES, "stream": False, "options": SHORT})
    after = client.simulate_get("/werk/v1/observability", headers=AUTH).json["data"]["chat"]
    assert after["requests_total"] == before["requests_total"] + 2 and after["requests_active"] == 0
    assert after["prompt_tokens_total"] == before["prompt_tokens_total"] + 2 * _count(client, MESSAGES)


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        ({"model": "nope", "messages": MESSAGES}, 404, "not served"),
        ({"model": "tiny", "messages": [{"role": "user", "content": "word " * 70}], "options": SHORT}, 400, "context"),
        ({"model": "tiny", "messages": MESSAGES, "options": {"temperature": "hot"}}, 400, "temperature"),
        ({"model": "tiny", "messages": MESSAGES, "tools": [{"type": "function"}]}, 400, "function"),
        (
            {"model": "tiny", "messages": MESSAGES, "tools": [{"type": "function", "function": {"name": "a b"}}]},
            400,
            "name",
        ),
        (
            {"model": "tiny", "messages": MESSAGES, "think": "high", "options": {"num_predict": 8}},
            400,
            "reasoning tier",
        ),
        ({"messages": MESSAGES}, 400, "model"),
    ],
)
def test_bad_input_is_ollamas_4xx(
    client: falcon.testing.TestClient, body: dict[str, Any], status: int, fragment: str
) -> None:
    before = client.simulate_get("/werk/v1/observability", headers=AUTH).json["data"]["chat"]["requests_total"]
    assert fragment in _error(_post(client, "/api/chat", body), status)
    after = client.simulate_get("/werk/v1/observability", headers=AUTH).json["data"]["chat"]["requests_total"]
    assert after == before


def test_options_ollama_ignores_or_cannot_apply_are_accepted(client: falcon.testing.TestClient) -> None:
    """Ollama ignores options it does not know, and ``num_ctx`` cannot resize a running
    instance's context; a ``num_predict`` above the ceiling is clamped (docs/compat.md)."""
    for options in (
        {"num_ctx": CONTEXT_TOKENS + 1, **SHORT},
        {"mirostat": 1, "tfs_z": 2, "penalize_newline": True, "no_such_option": [1], **SHORT},
        {"num_keep": 4, "num_thread": 2, "low_vram": True, "f16_kv": True, **SHORT},
    ):
        result = _post(
            client, "/api/chat", {"model": "tiny", "messages": MESSAGES, "stream": False, "options": options}
        )
        assert result.status_code == 200, (options, result.text)
    clamped = _post(
        client,
        "/api/chat",
        {"model": "tiny", "messages": MESSAGES, "stream": False, "options": {"num_predict": MAX_OUTPUT_TOKENS + 1}},
    )
    assert clamped.status_code == 200, clamped.text
    applied = min(
        MAX_OUTPUT_TOKENS, CONTEXT_TOKENS - _count(client, MESSAGES)
    )  # the ceiling, or what the context leaves
    assert clamped.headers["x-werk-max-tokens-applied"] == str(applied) and clamped.json["eval_count"] <= applied


def test_a_reasoning_tier_the_profile_offers_is_accepted(
    client: falcon.testing.TestClient, host: tuple[Host, MemoryBackendPlugin]
) -> None:
    result = _post(
        client, "/api/chat", {"model": "tiny", "messages": MESSAGES, "think": True, "stream": False, "options": SHORT}
    )
    assert result.status_code == 200, result.text


def test_keys_and_routes(client: falcon.testing.TestClient) -> None:
    for path in ("/api/tags", "/api/ps", "/api/version"):
        assert _error(client.simulate_get(path), 401) == "missing or invalid API key"
    assert _error(client.simulate_post("/api/chat", json={"model": "tiny"}), 401)
    bad = client.simulate_get("/api/tags", headers={"Authorization": "Bearer sk-wrong"})
    _error(bad, 401)
    assert _error(client.simulate_post("/api/pull", json={"model": "x"}, headers=AUTH), 404) == "no such route"
    _error(client.simulate_get("/api/chat", headers=AUTH), 405)


@pytest.mark.parametrize("name", sorted(HOSTILE_BODIES))
def test_hostile_bodies_are_400_in_each_shape(client: falcon.testing.TestClient, name: str) -> None:
    raw = HOSTILE_BODIES[name]
    for path in ("/api/chat", "/api/generate", "/api/show"):
        _error(client.simulate_post(path, body=raw, headers={**AUTH, "content-type": "application/json"}), 400)
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        result = client.simulate_post(path, body=raw, headers={"x-api-key": KEY, "content-type": "application/json"})
        assert result.status_code == 400 and result.json["error"]["type"] == "invalid_request_error", result.text


def test_keep_alive_acts_on_residency(client: falcon.testing.TestClient) -> None:
    assert _state(client) == "ready"
    unload = _post(client, "/api/generate", {"model": "tiny", "keep_alive": 0})
    assert unload.json["done_reason"] == "unload" and _state(client) == "cold"
    assert client.simulate_get("/api/ps", headers=AUTH).json["models"] == []
    load = _post(client, "/api/chat", {"model": "tiny:latest", "keep_alive": "5m"})
    assert load.json["done_reason"] == "load" and load.json["message"]["content"] == "" and _state(client) == "ready"
    # a request with keep_alive 0 is answered, then its instance stops
    once = _post(
        client, "/api/chat", {"model": "tiny", "messages": MESSAGES, "keep_alive": 0, "stream": False, "options": SHORT}
    )
    assert once.status_code == 200 and _state(client) == "cold"
    streamed = _post(client, "/api/chat", {"model": "tiny", "messages": MESSAGES, "keep_alive": "0", "options": SHORT})
    assert _lines(streamed.text)[-1]["done"] is True and _state(client) == "cold"
    kept = _post(
        client,
        "/api/chat",
        {"model": "tiny", "messages": MESSAGES, "keep_alive": -1, "stream": False, "options": SHORT},
    )
    assert kept.status_code == 200 and _state(client) == "ready"
    assert _error(_post(client, "/api/generate", {"model": "nope"}), 404)

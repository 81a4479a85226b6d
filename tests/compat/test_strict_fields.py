"""Invalid values are typed 400s, never lenient 2xx (issue 48, item 6), the context overflow
names the input when the input alone exceeds (issue 48, "also from real clients") and
``NAME:latest`` resolves on the ``/v1`` routes as on the Ollama ones.

Each refused body is refused before the backend: the chat counters do not move."""

from __future__ import annotations

from typing import Any

import falcon.testing
import pytest

from tests.compat.conftest import KEY
from werk_host.testing.reference import CONTEXT_TOKENS, MAX_OUTPUT_TOKENS

AUTH = {"Authorization": f"Bearer {KEY}"}
USER = [{"role": "user", "content": "hi"}]


def _chat(**extra: Any) -> dict[str, Any]:
    return {"model": "tiny", "messages": USER, "max_tokens": 2, **extra}


def _responses(**extra: Any) -> dict[str, Any]:
    return {"model": "tiny", "input": "hi", "max_output_tokens": 2, **extra}


CALL = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
OUTPUT = {"type": "function_call_output", "call_id": "c1", "output": "ok"}

BAD: dict[str, tuple[str, dict[str, Any], str]] = {
    "schema false": (
        "/v1/chat/completions",
        _chat(response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": False}}),
        "schema",
    ),
    "schema an array": (
        "/v1/chat/completions",
        _chat(response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": [1]}}),
        "schema",
    ),
    "json_schema missing": ("/v1/chat/completions", _chat(response_format={"type": "json_schema"}), "json_schema"),
    "format type unknown": ("/v1/chat/completions", _chat(response_format={"type": "yaml"}), "response_format"),
    "stop a number": ("/v1/chat/completions", _chat(stop=5), "stop"),
    "stop too many": ("/v1/chat/completions", _chat(stop=[str(i) for i in range(17)]), "stop"),
    "temperature negative": ("/v1/chat/completions", _chat(temperature=-1), "temperature"),
    "temperature huge": ("/v1/chat/completions", _chat(temperature=1e308), "temperature"),
    "seed 2**70": ("/v1/chat/completions", _chat(seed=2**70), "seed"),
    "logit_bias key": ("/v1/chat/completions", _chat(logit_bias={"abc": 1}), "logit_bias"),
    "logit_bias value": ("/v1/chat/completions", _chat(logit_bias={"15": 101}), "logit_bias"),
    "completion seed": ("/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 2, "seed": 2**70}, "seed"),
    "completion temperature": (
        "/v1/completions",
        {"model": "tiny", "prompt": "hi", "max_tokens": 2, "temperature": 9},
        "temperature",
    ),
    "completion logit_bias": (
        "/v1/completions",
        {"model": "tiny", "prompt": "hi", "max_tokens": 2, "logit_bias": {"x": 1}},
        "logit_bias",
    ),
    "responses tool without type": ("/v1/responses", _responses(tools=[{"name": "f"}]), "tools[0]"),
    "responses unknown tool": ("/v1/responses", _responses(tools=[{"type": "computer_use"}]), "computer_use"),
    "responses orphan output": (
        "/v1/responses",
        _responses(input=[{"role": "user", "content": "hi"}, OUTPUT]),
        "function_call_output",
    ),
    "responses output 2**63": ("/v1/responses", _responses(max_output_tokens=2**63), "max_output_tokens"),
}


def _total(client: falcon.testing.TestClient) -> int:
    total: int = client.simulate_get("/werk/v1/observability", headers=AUTH).json["data"]["chat"]["requests_total"]
    return total


@pytest.mark.parametrize("name", sorted(BAD))
def test_invalid_values_are_typed_400s(client: falcon.testing.TestClient, name: str) -> None:
    path, body, fragment = BAD[name]
    before = _total(client)
    result = client.simulate_post(path, json=body, headers=AUTH)
    assert result.status_code == 400, result.text
    error = result.json["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_request"), error
    assert fragment in error["message"], error
    assert _total(client) == before  # the backend never saw it


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (
            "/v1/chat/completions",
            _chat(
                temperature=0.7,
                seed=-(2**63),
                stop=["\n"],
                logit_bias={"15": -100},
                response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}},
            ),
        ),
        ("/v1/chat/completions", _chat(stop="x", temperature=2, response_format={"type": "json_object"})),
        ("/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 2, "seed": 42, "temperature": 0}),
        (
            "/v1/responses",
            _responses(input=[{"role": "user", "content": "hi"}, CALL, OUTPUT], max_output_tokens=2**31 - 1),
        ),
        ("/v1/responses", _responses(tools=[{"type": "web_search"}])),  # accepted and left out, as documented
    ],
    ids=["chat", "chat short forms", "completions", "responses answered call", "responses ignored tool"],
)
def test_valid_values_still_pass(client: falcon.testing.TestClient, path: str, body: dict[str, Any]) -> None:
    result = client.simulate_post(path, json=body, headers=AUTH)
    assert result.status_code == 200, result.text


def test_an_input_alone_beyond_the_context_is_named(client: falcon.testing.TestClient) -> None:
    long = [{"role": "user", "content": "word " * CONTEXT_TOKENS}]
    result = client.simulate_post("/v1/chat/completions", json=_chat(messages=long, max_tokens=1), headers=AUTH)
    assert result.status_code == 400, result.text
    error = result.json["error"]
    assert error["code"] == "context_length_exceeded" and error["message"].startswith("the input alone needs"), error
    near = [{"role": "user", "content": "word " * 4}]
    result = client.simulate_post(
        "/v1/chat/completions", json=_chat(messages=near, max_tokens=MAX_OUTPUT_TOKENS), headers=AUTH
    )
    message = result.json["error"]["message"]
    assert result.status_code == 400 and message.startswith("input plus requested output needs"), result.text


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", _chat(model="tiny:latest")),
        ("/v1/completions", {"model": "tiny:latest", "prompt": "hi", "max_tokens": 2}),
        ("/v1/responses", _responses(model="tiny:latest")),
        ("/v1/messages", {"model": "tiny:latest", "max_tokens": 2, "messages": USER}),
        ("/api/chat", {"model": "tiny:latest", "messages": USER, "stream": False, "options": {"num_predict": 2}}),
    ],
)
def test_latest_resolves_on_every_route(client: falcon.testing.TestClient, path: str, body: dict[str, Any]) -> None:
    result = client.simulate_post(path, json=body, headers=AUTH)
    assert result.status_code == 200, result.text
    assert result.json["model"] == "tiny:latest"  # named as asked
    other = client.simulate_post(path, json={**body, "model": "nope:latest"}, headers=AUTH)
    assert other.status_code == 404, other.text


def _wide(n: int) -> dict[str, Any]:
    return {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(n)}}


def _deep(d: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "integer"}
    for _ in range(d):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


WIDE = _wide(20_000)  # 609 KB: the schema that killed llama-server (issue 48, item 2)
FUNCTION = {"name": "f", "description": "d"}


def _schema_bodies(schema: dict[str, Any]) -> dict[str, tuple[str, dict[str, Any]]]:
    """The same schema where each API family makes it a grammar."""
    return {
        "openai response_format": (
            "/v1/chat/completions",
            _chat(response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}),
        ),
        "openai forced tool": (
            "/v1/chat/completions",
            _chat(tools=[{"type": "function", "function": {**FUNCTION, "parameters": schema}}], tool_choice="required"),
        ),
        "ollama format": (
            "/api/chat",
            {"model": "tiny", "messages": USER, "stream": False, "format": schema, "options": {"num_predict": 2}},
        ),
        "anthropic forced tool": (
            "/v1/messages",
            {
                "model": "tiny",
                "max_tokens": 2,
                "messages": USER,
                "tools": [{**FUNCTION, "input_schema": schema}],
                "tool_choice": {"type": "tool", "name": "f"},
            },
        ),
        "responses text.format": (
            "/v1/responses",
            _responses(text={"format": {"type": "json_schema", "name": "a", "schema": schema}}),
        ),
    }


@pytest.mark.parametrize(
    ("schema", "bound"),
    [(WIDE, "65536 bytes"), (_wide(641), "640 properties"), (_deep(40), "nests deeper than 64")],
    ids=["20000 properties", "641 properties", "depth 40"],
)
@pytest.mark.parametrize("family", sorted(_schema_bodies({})))
def test_a_schema_past_a_bound_is_a_400_naming_it(
    client: falcon.testing.TestClient, family: str, schema: dict[str, Any], bound: str
) -> None:
    path, body = _schema_bodies(schema)[family]
    before = _total(client)
    result = client.simulate_post(path, json=body, headers=AUTH)
    assert result.status_code == 400, result.text
    assert bound in result.text, result.text
    assert _total(client) == before  # never converted by the backend


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"a": {"type": "string", "enum": [str(i) for i in range(4097)]}}},
        {"type": "object", "properties": {"a": {"type": "string", "pattern": "a" * 4097}}},
        {"type": "object", "properties": {"a": {"type": "string", "description": "x" * 70_000}}},
    ],
    ids=["enum", "pattern", "size"],
)
def test_enum_pattern_and_size_bounds(client: falcon.testing.TestClient, schema: dict[str, Any]) -> None:
    path, body = _schema_bodies(schema)["openai response_format"]
    result = client.simulate_post(path, json=body, headers=AUTH)
    assert result.status_code == 400 and "response_format.json_schema.schema" in result.text, result.text


def test_schemas_within_the_bounds_pass(client: falcon.testing.TestClient) -> None:
    for family, (path, body) in _schema_bodies(_wide(64)).items():
        result = client.simulate_post(path, json=body, headers=AUTH)
        assert result.status_code != 400 or "schema" not in result.text, (family, result.text)

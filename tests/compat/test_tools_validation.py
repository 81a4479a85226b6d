"""Tool shapes are validated before the backend (issue 28, item 7): malformed ``tools``,
``tool_choice`` and assistant ``tool_calls`` are a 400 in each API's own shape, on
``/v1/chat/completions`` and on ``/werk/v1/chat/count_tokens`` and ``/admission`` alike, and
never reach the backend; well-formed ones pass through as sent."""

from __future__ import annotations

from typing import Any

import falcon.testing
import pytest

from tests.compat.conftest import KEY
from werk_host.server import Host
from werk_host.testing.reference import MemoryBackendPlugin

AUTH = {"Authorization": f"Bearer {KEY}"}
QUESTION: list[dict[str, Any]] = [{"role": "user", "content": "what is the weather"}]
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "the weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        "strict": True,
    },
}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}

BAD_TOOLS: dict[str, Any] = {
    "empty object": [{}],
    "no function": [{"type": "function"}],
    "empty function": [{"type": "function", "function": {}}],
    "unknown type": [{"type": "code_interpreter"}],
    "name with a space": [{"type": "function", "function": {"name": "get weather"}}],
    "name too long": [{"type": "function", "function": {"name": "f" * 65}}],
    "parameters not an object": [{"type": "function", "function": {"name": "f", "parameters": "x"}}],
    "strict not a boolean": [{"type": "function", "function": {"name": "f", "strict": 1}}],
    "not a list": {"type": "function"},
}
BAD_CALLS: dict[str, Any] = {
    "a string": "x",
    "empty object": [{}],
    "no function": [{"id": "c", "type": "function"}],
    "arguments not a string": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": {}}}],
    "unknown type": [{"id": "c", "type": "custom", "function": {"name": "f", "arguments": "{}"}}],
}
BAD_CHOICES: dict[str, Any] = {
    "unknown word": "sometimes",
    "no function": {"type": "function"},
    "bad name": {"type": "function", "function": {"name": "a b"}},
    "a number": 1,
}


def _bodies() -> dict[str, dict[str, Any]]:
    bodies = {f"tools {k}": {"messages": QUESTION, "tools": v} for k, v in BAD_TOOLS.items()}
    for name, calls in BAD_CALLS.items():
        messages = [*QUESTION, {"role": "assistant", "content": None, "tool_calls": calls}]
        bodies[f"tool_calls {name}"] = {"messages": messages}
    for name, choice in BAD_CHOICES.items():
        bodies[f"tool_choice {name}"] = {"messages": QUESTION, "tools": [TOOL], "tool_choice": choice}
    for name, value in {"an object": {"a": 1}, "a number": 1}.items():
        bodies[f"message name {name}"] = {"messages": [{"role": "user", "content": "hi", "name": value}]}
    answered = [*QUESTION, {"role": "assistant", "content": None, "tool_calls": [CALL]}]
    bodies["tool_call_id a number"] = {"messages": [*answered, {"role": "tool", "tool_call_id": 1, "content": "x"}]}
    return bodies


BAD = _bodies()


def _post(client: falcon.testing.TestClient, path: str, body: object) -> falcon.testing.Result:
    return client.simulate_post(path, json=body, headers=AUTH)


def _chat_total(client: falcon.testing.TestClient) -> int:
    chat = client.simulate_get("/werk/v1/observability", headers=AUTH).json["data"]["chat"]
    total: int = chat["requests_total"]
    return total


@pytest.mark.parametrize("name", sorted(BAD))
def test_malformed_tools_are_400_on_chat(
    client: falcon.testing.TestClient, host: tuple[Host, MemoryBackendPlugin], name: str
) -> None:
    before = _chat_total(client)
    result = _post(client, "/v1/chat/completions", {"model": "tiny", "max_tokens": 4, **BAD[name]})
    assert result.status_code == 400, result.text
    error = result.json["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_request", error
    assert "tool" in error["message"] or ".name" in error["message"], error
    assert _chat_total(client) == before  # refused before the backend


@pytest.mark.parametrize("name", sorted(BAD))
@pytest.mark.parametrize("path", ["/werk/v1/chat/count_tokens", "/werk/v1/chat/admission"])
def test_malformed_tools_are_400_on_planning(client: falcon.testing.TestClient, path: str, name: str) -> None:
    result = _post(client, path, BAD[name])
    assert result.status_code == 400, result.text
    error = result.json["error"]
    assert error["code"] == "invalid_request" and error["retryable"] is False, error


def test_well_formed_tools_pass_through(
    client: falcon.testing.TestClient, host: tuple[Host, MemoryBackendPlugin]
) -> None:
    messages = [
        *QUESTION,
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    for choice in ("auto", "none", "required", {"type": "function", "function": {"name": "get_weather"}}):
        body = {"messages": messages, "tools": [TOOL], "tool_choice": choice}
        assert _post(client, "/werk/v1/chat/count_tokens", body).status_code == 200
        assert _post(client, "/werk/v1/chat/admission", body).status_code == 200
        result = _post(client, "/v1/chat/completions", {"model": "tiny", "max_tokens": 4, **body})
        assert result.status_code == 200, result.text


def test_tools_are_kept_as_sent() -> None:
    """The request counted is the one the chat sends: members in the client's order, extras kept."""
    from werk_host.protocol import ChatRequest

    tool = {"function": {"parameters": {"type": "object"}, "name": "f", "x-extra": 1}, "type": "function"}
    call = {"function": {"arguments": "{}", "name": "f"}, "type": "function", "id": "c"}
    request = ChatRequest.model_validate(
        {"messages": [*QUESTION, {"role": "assistant", "tool_calls": [call]}], "tools": [tool]}
    )
    dumped = request.model_dump(mode="json", exclude_none=True)
    assert dumped["tools"] == [tool] and list(dumped["tools"][0]["function"]) == ["parameters", "name", "x-extra"]
    assert dumped["messages"][1]["tool_calls"] == [call] and list(dumped["messages"][1]["tool_calls"][0]) == [
        "function",
        "type",
        "id",
    ]

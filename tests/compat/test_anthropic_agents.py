"""``/v1/messages`` for coding agents over a reference backend that calls tools and thinks: the
recorded Claude Code request end to end, a forced tool call and its ``tool_result`` turn with
the official ``anthropic`` SDK (streamed and not), thinking mapped onto the reference's verified
reasoning tiers, and count_tokens equal to the answer's input tokens with tools present.

The backend here is the reference adapter (echoing the last message) with an agent's context and
output ceiling, which answers a forced tool choice (``required`` or a named function) with one
call of that tool, emits reasoning text when the host resolved a thinking tier for it, and keeps
every body it received, so each test checks what reached the backend as well as what came back.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import falcon.testing
import pytest

from tests.compat.conftest import KEY
from werk_host import hookimpl
from werk_host.protocol import CapabilityId, CapabilityStatus, ChatLimits
from werk_host.seam import InferenceResponse, JsonObject
from werk_host.server import Host
from werk_host.testing.hosts import make_host, running
from werk_host.testing.reference import EXPERIMENTAL_STATE, PLUGIN_NAME, MemoryAdapter, MemoryBackendPlugin

FIXTURES = Path(__file__).parent / "fixtures"
#: Claude Code's recorded requests: a retry with 22 tools (cache_control ttl 1h), the first with
#: deferred tools, and the first with its default model (output_config on a system message).
RECORDED = (
    FIXTURES / "claude_code_request.json",
    FIXTURES / "agents" / "claude_code_messages.json",
    FIXTURES / "agents" / "claude_code_messages_default_model.json",
)
CONTEXT = 100_000
CEILING = 4096
HEADERS = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
WEATHER: dict[str, Any] = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
TIME: dict[str, Any] = {"name": "get_time", "input_schema": {"type": "object", "properties": {}}}
ASK: list[anthropic.types.MessageParam] = [{"role": "user", "content": "what is the weather in Paris"}]
ARGUMENTS = '{"city": "Paris"}'
#: the fields count_tokens takes (the rest of a messages body is the answer's business)
COUNTED = ("model", "messages", "system", "tools", "tool_choice", "thinking", "output_config", "context_management")


def _chunks(head: JsonObject, deltas: list[JsonObject], finish: str, usage: JsonObject) -> Iterator[bytes]:
    for delta in deltas:
        yield (
            b"data: "
            + json.dumps({**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}).encode()
            + b"\n\n"
        )
    done = {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}
    yield b"data: " + json.dumps(done).encode() + b"\n\n"
    yield b"data: " + json.dumps({**head, "choices": [], "usage": usage}).encode() + b"\n\ndata: [DONE]\n\n"


class AgentAdapter(MemoryAdapter):
    plugin: AgentBackend

    @hookimpl(specname="werk_chat_limits")
    def chat_limits(self, model: str | None) -> ChatLimits:
        limits = super().chat_limits(model)
        return limits.model_copy(update={"context_tokens": CONTEXT, "max_output_tokens": CEILING})

    @hookimpl(specname="werk_chat_completion")
    def chat_completion(self, request: JsonObject) -> InferenceResponse:
        self.plugin.bodies.append(request)
        werk = request.get("werk")
        reasoning = werk.get("reasoning") if isinstance(werk, dict) else None
        thinks = isinstance(reasoning, dict) and bool(reasoning.get("resolved_budget_tokens"))
        choice = request.get("tool_choice")
        tools = request.get("tools")
        if not thinks and choice not in ("required",) and not isinstance(choice, dict):
            return super().chat_completion(request)
        answer = super().chat_completion({**request, "stream": False})
        doc = json.loads(b"".join(answer.body))
        usage, message = doc["usage"], doc["choices"][0]["message"]
        deltas: list[JsonObject] = []
        finish = doc["choices"][0]["finish_reason"]
        if thinks:
            message["reasoning_content"] = "weighing it"
            deltas += [{"reasoning_content": "weighing"}, {"reasoning_content": " it"}]
        if isinstance(choice, dict) or choice == "required":
            assert isinstance(tools, list)
            name = choice["function"]["name"] if isinstance(choice, dict) else tools[0]["function"]["name"]
            call_id = "call_" + secrets.token_hex(4)
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": ARGUMENTS}}
            message.update(content=None, tool_calls=[call])
            first = {"index": 0, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}
            deltas += [
                {"tool_calls": [first]},
                {"tool_calls": [{"index": 0, "function": {"arguments": ARGUMENTS[:9]}}]},
                {"tool_calls": [{"index": 0, "function": {"arguments": ARGUMENTS[9:]}}]},
            ]
            finish = "tool_calls"
        elif message["content"]:
            deltas.append({"content": message["content"]})
        if request.get("stream") is not True:
            doc["choices"][0]["finish_reason"] = finish
            body = json.dumps(doc).encode()
            return InferenceResponse(200, {"Content-Type": "application/json"}, iter([body]), lambda: None)
        head = {"id": doc["id"], "object": "chat.completion.chunk", "created": doc["created"], "model": doc["model"]}
        events = _chunks(head, deltas, finish, usage)
        return InferenceResponse(200, {"Content-Type": "text/event-stream"}, events, lambda: None)


class AgentBackend(MemoryBackendPlugin):
    adapter_class = AgentAdapter

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.bodies: list[JsonObject] = []


def _host(tmp_path: Path) -> tuple[Host, AgentBackend]:
    home = tmp_path / "home"
    home.mkdir()
    plugin = AgentBackend(statuses={**EXPERIMENTAL_STATE, CapabilityId.REASONING: CapabilityStatus.SUPPORTED})
    return make_host(home, plugin=plugin, plugin_name=PLUGIN_NAME, operator_api_keys=(KEY,)), plugin


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[tuple[falcon.testing.TestClient, AgentBackend]]:
    host, plugin = _host(tmp_path)
    try:
        yield falcon.testing.TestClient(host.app), plugin
    finally:
        host.close()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, AgentBackend]]:
    host, plugin = _host(tmp_path)
    with running(host) as url:
        yield url, plugin


def _events(text: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in text.strip().split("\n\n"):
        name, data = block.split("\n")
        out.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


def _count(client: falcon.testing.TestClient, body: dict[str, Any]) -> int:
    counted = {k: v for k, v in body.items() if k in COUNTED}
    result = client.simulate_post("/v1/messages/count_tokens", json=counted, headers=HEADERS)
    assert result.status_code == 200, result.text
    tokens: int = result.json["input_tokens"]
    return tokens


@pytest.mark.parametrize("fixture", RECORDED, ids=lambda p: p.stem)
def test_the_recorded_claude_code_request_is_served(
    agent: tuple[falcon.testing.TestClient, AgentBackend], fixture: Path
) -> None:
    client, backend = agent
    recorded = json.loads(fixture.read_text())
    body = {**recorded["body"], "model": "tiny"}
    headers = {k: v for k, v in recorded["headers"].items() if k not in ("accept-encoding", "content-type")}
    result = client.simulate_post(
        "/v1/messages", json=body, params={"beta": "true"}, headers={**headers, "x-api-key": KEY}
    )
    assert result.status_code == 200, result.text
    assert result.headers["x-werk-max-tokens-applied"] == str(CEILING)  # 32000 clamped to the ceiling
    events = _events(result.text)
    assert [n for n, _ in events][0] == "message_start" and [n for n, _ in events][-1] == "message_stop"
    final = events[-2][1]
    assert final["type"] == "message_delta" and final["delta"]["stop_reason"] in ("end_turn", "max_tokens")
    assert final["context_management"] == {"applied_edits": []}
    assert final["usage"]["input_tokens"] == _count(client, body) > 0
    sent = backend.bodies[-1]
    assert sent["max_tokens"] == CEILING and len(sent["tools"]) == len(body["tools"])
    assert "$schema" not in json.dumps(sent["tools"]) and [m["role"] for m in sent["messages"]] == [
        "system",
        "user",
        "system",
    ]
    assert sent["werk"]["reasoning"]["tier"] in {"none", "low", "medium", "high", "max", "ultra"}  # "default" resolved


@pytest.mark.parametrize("stream", [False, True])
def test_a_forced_tool_call_and_its_result_turn_with_the_sdk(served: tuple[str, AgentBackend], stream: bool) -> None:
    url, backend = served
    choices: list[Any] = [{"type": "tool", "name": "get_weather"}, {"type": "any"}]
    with anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0, timeout=30) as client:
        for choice in choices:
            tools: Any = [WEATHER, TIME]
            if stream:
                with client.messages.stream(
                    model="tiny", max_tokens=64, messages=ASK, tools=tools, tool_choice=choice
                ) as events:
                    partial = "".join(e.partial_json for e in events if e.type == "input_json")
                    reply = events.get_final_message()
                assert json.loads(partial) == {"city": "Paris"}
            else:
                reply = client.messages.create(
                    model="tiny", max_tokens=64, messages=ASK, tools=tools, tool_choice=choice
                )
            assert reply.stop_reason == "tool_use"
            (use,) = [b for b in reply.content if b.type == "tool_use"]
            assert use.name == "get_weather" and use.input == {"city": "Paris"} and use.id.startswith("toolu_")
            sent = backend.bodies[-1]
            assert sent["tool_choice"] == (
                "required" if choice["type"] == "any" else {"type": "function", "function": {"name": "get_weather"}}
            )
            follow: list[anthropic.types.MessageParam] = [
                *ASK,
                {"role": "assistant", "content": reply.content},  # type: ignore[typeddict-item]
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny and mild"}],
                },
            ]
            done = client.messages.create(model="tiny", max_tokens=64, messages=follow, tools=tools)
            assert done.stop_reason == "end_turn" and [b.text for b in done.content if b.type == "text"] == [
                "sunny and mild"
            ]
            counted = client.messages.count_tokens(model="tiny", messages=follow, tools=tools)
            assert counted.input_tokens == done.usage.input_tokens
            turns = backend.bodies[-1]["messages"]
            assert turns[-2]["tool_calls"][0]["id"] == use.id and turns[-1] == {
                "role": "tool",
                "tool_call_id": use.id,
                "content": "sunny and mild",
            }


def test_thinking_maps_onto_the_reasoning_tiers(served: tuple[str, AgentBackend]) -> None:
    url, backend = served
    with anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0, timeout=30) as client:
        reply = client.messages.create(
            model="tiny", max_tokens=9000, messages=ASK, thinking={"type": "enabled", "budget_tokens": 1500}
        )
        # the largest tier within the budget (medium: 1024), not the default tier (high, for 4096 output)
        assert backend.bodies[-1]["werk"]["reasoning"] == {"tier": "medium", "resolved_budget_tokens": 1024}
        assert [b.type for b in reply.content] == ["thinking", "text"]
        thinking = reply.content[0]
        assert thinking.type == "thinking" and thinking.thinking == "weighing it" and thinking.signature
        with client.messages.stream(
            model="tiny", max_tokens=9000, messages=ASK, thinking={"type": "adaptive"}
        ) as events:
            final = events.get_final_message()
        assert final.content[0].type == "thinking" and final.content[0].thinking == "weighing it"
        again: list[anthropic.types.MessageParam] = [
            *ASK,
            {"role": "assistant", "content": reply.content},  # type: ignore[typeddict-item]
            {"role": "user", "content": "and in Rome"},
        ]
        off = client.messages.create(model="tiny", max_tokens=64, messages=again, thinking={"type": "disabled"})
        assert backend.bodies[-1]["werk"]["reasoning"] == {"tier": "none", "resolved_budget_tokens": 0}
        assert "weighing" not in json.dumps(backend.bodies[-1]["messages"])  # thinking sent back is dropped
        assert [b.type for b in off.content] == ["text"]
        counted = client.messages.count_tokens(model="tiny", messages=again, thinking={"type": "disabled"})
        assert counted.input_tokens == off.usage.input_tokens


def test_clamped_requests_are_counted(agent: tuple[falcon.testing.TestClient, AgentBackend]) -> None:
    client, _ = agent
    auth = {"Authorization": f"Bearer {KEY}"}
    before = client.simulate_get("/werk/v1/observability", headers=auth).json["data"]["chat"]["requests_clamped"]
    body = {"model": "tiny", "max_tokens": 32000, "messages": ASK}
    assert client.simulate_post("/v1/messages", json=body, headers=HEADERS).headers["x-werk-max-tokens-applied"] == str(
        CEILING
    )
    small = client.simulate_post("/v1/messages", json={**body, "max_tokens": 8}, headers=HEADERS)
    assert small.status_code == 200 and "x-werk-max-tokens-applied" not in small.headers
    after = client.simulate_get("/werk/v1/observability", headers=auth).json["data"]["chat"]["requests_clamped"]
    assert after == before + 1
    assert 'werk_chat_requests_clamped_total{instance="tiny"} 1.0' in client.simulate_get("/metrics", headers=auth).text

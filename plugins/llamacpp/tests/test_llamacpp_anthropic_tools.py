"""Anthropic tools with the official ``anthropic`` SDK against ``werk serve`` on a real
llama-server running the real SmolLM2-135M-Instruct (docs/compat.md, "Anthropic Messages").

A forced tool call (``tool_choice`` ``tool`` and ``any``), streamed and not, arrives as a
``tool_use`` block whose ``input`` (or ``input_json_delta`` pieces) is the call's arguments; its
``tool_result`` follow-up turn completes; count_tokens equals the answer's
``usage.input_tokens`` with tools present; the recorded Claude Code request answers 200 with its
``max_tokens: 32000`` clamped (``X-Werk-Max-Tokens-Applied``). Nothing gets a 5xx.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
from werk_llamacpp.process import ENV_ARGS

from werk_host.plugin import ModelManifest
from werk_host.testing.host import ModelRegistry
from werk_host.testing.hosts import serve_process

pytestmark = pytest.mark.llamaserver
KEY = "sk-werk-anthropic-tools-5521"
MODEL = "smollm2"
ROOT = Path(__file__).resolve().parents[3]
CLAUDE_CODE = ROOT / "tests" / "compat" / "fixtures" / "claude_code_request.json"
WEATHER: Any = {
    "name": "get_weather",
    "description": "Get the current weather in a city.",
    "input_schema": {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {"city": {"type": "string", "description": "The city name"}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
TIME: Any = {
    "name": "get_time",
    "description": "Get the current time in a time zone.",
    "input_schema": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]},
}
TOOLS: Any = [WEATHER, TIME]
ASK: list[anthropic.types.MessageParam] = [{"role": "user", "content": "What is the weather in Paris right now?"}]
#: greedy sampling (the SDK has no temperature argument; the field is Anthropic's)
GREEDY: Any = {"temperature": 0}
CHOICES: dict[str, Any] = {"tool": {"type": "tool", "name": "get_weather"}, "any": {"type": "any"}}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, llama_server_path: Path, smollm2_gguf: Path) -> Iterator[str]:
    """``werk serve --model smollm2`` in its own process, keyed; yields its base URL."""
    root = tmp_path_factory.mktemp("anthropic-tools")
    home = root / "home"
    home.mkdir()
    ModelRegistry(home).add(ModelManifest.from_paths(MODEL, [smollm2_gguf], backend="llama.cpp"))
    environ = {"WERK_LLAMA_SERVER": str(llama_server_path)}
    with serve_process(home, "--model", MODEL, keys=(KEY,), env=environ, drop=(ENV_ARGS,)) as served:
        yield served.url


@pytest.fixture
def client(served: str) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=served, api_key=KEY, max_retries=0, timeout=300) as made:
        yield made


def _forced(client: anthropic.Anthropic, choice: Any, stream: bool) -> anthropic.types.Message:
    """A forced call of ``get_weather``; streamed, its ``input_json_delta`` pieces must make up
    the final block's ``input``."""
    options: Any = {"model": MODEL, "max_tokens": 96, "messages": ASK, "tools": TOOLS, "tool_choice": choice}
    if not stream:
        return client.messages.create(**options, extra_body=GREEDY)
    with client.messages.stream(**options, extra_body=GREEDY) as events:
        pieces = [e.partial_json for e in events if e.type == "input_json"]
        reply = events.get_final_message()
    (use,) = [b for b in reply.content if b.type == "tool_use"]
    assert pieces and json.loads("".join(pieces)) == use.input
    return reply


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("choice", sorted(CHOICES))
def test_a_forced_tool_call_and_its_result_turn(client: anthropic.Anthropic, choice: str, stream: bool) -> None:
    reply = _forced(client, CHOICES[choice], stream)
    assert reply.stop_reason == "tool_use", reply
    uses = [b for b in reply.content if b.type == "tool_use"]
    assert uses and all(u.id.startswith("toolu_") for u in uses)
    if choice == "tool":
        assert [u.name for u in uses] == ["get_weather"]
    use = uses[0]
    schema = WEATHER if use.name == "get_weather" else TIME
    assert isinstance(use.input, dict) and set(schema["input_schema"]["required"]) <= set(use.input)
    assert all(isinstance(v, str) for v in use.input.values())
    counted = client.messages.count_tokens(model=MODEL, messages=ASK, tools=TOOLS, tool_choice=CHOICES[choice])
    assert counted.input_tokens == reply.usage.input_tokens + (reply.usage.cache_read_input_tokens or 0) > 0

    follow: list[anthropic.types.MessageParam] = [
        *ASK,
        {"role": "assistant", "content": reply.content},  # type: ignore[typeddict-item]
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": u.id, "content": "Sunny, 21 degrees Celsius."} for u in uses
            ],
        },
    ]
    done = client.messages.create(model=MODEL, max_tokens=48, messages=follow, tools=TOOLS, extra_body=GREEDY)
    assert done.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert done.content and done.usage.output_tokens > 0
    counted = client.messages.count_tokens(model=MODEL, messages=follow, tools=TOOLS)
    assert counted.input_tokens == done.usage.input_tokens + (done.usage.cache_read_input_tokens or 0)


def test_count_tokens_counts_tools_and_system_messages(client: anthropic.Anthropic) -> None:
    turns: Any = [*ASK, {"role": "system", "content": "Answer in French."}]
    reply = client.messages.create(
        model=MODEL, max_tokens=8, system="You are a weather bot.", messages=turns, tools=TOOLS, extra_body=GREEDY
    )
    counted = client.messages.count_tokens(model=MODEL, system="You are a weather bot.", messages=turns, tools=TOOLS)
    assert counted.input_tokens == reply.usage.input_tokens + (reply.usage.cache_read_input_tokens or 0)
    bare = client.messages.count_tokens(model=MODEL, system="You are a weather bot.", messages=ASK)
    assert bare.input_tokens < counted.input_tokens  # the mid-conversation system message is counted


def test_the_recorded_claude_code_request_answers(served: str) -> None:
    """Claude Code's first request as recorded (22 tools, adaptive thinking, a system entry in
    ``messages``, ``max_tokens: 32000``), streamed as it asks: 200, clamped, a complete stream."""
    recorded = json.loads(CLAUDE_CODE.read_text())
    body = {**recorded["body"], "model": MODEL}
    headers = {k: v for k, v in recorded["headers"].items() if k not in ("accept-encoding", "content-type")}
    headers["x-api-key"] = KEY
    with httpx.stream(
        "POST", f"{served}/v1/messages", params={"beta": "true"}, json=body, headers=headers, timeout=600
    ) as response:
        text = response.read().decode()
    assert response.status_code == 200, text[-2000:]
    applied = int(response.headers["x-werk-max-tokens-applied"])
    assert 0 < applied < 32000
    events = [json.loads(b.split("\ndata: ", 1)[1]) for b in text.strip().split("\n\n")]
    assert events[0]["type"] == "message_start" and events[-1]["type"] == "message_stop", events[-3:]
    final = events[-2]
    assert final["type"] == "message_delta" and final["delta"]["stop_reason"] in ("end_turn", "max_tokens", "tool_use")
    assert 0 < final["usage"]["output_tokens"] <= applied
    counted_body = {k: body[k] for k in ("model", "messages", "system", "tools", "thinking", "context_management")}
    counted = httpx.post(f"{served}/v1/messages/count_tokens", json=counted_body, headers=headers, timeout=120)
    total = final["usage"]["input_tokens"] + final["usage"].get("cache_read_input_tokens", 0)
    assert counted.status_code == 200 and counted.json()["input_tokens"] == total


def test_nothing_an_agent_sends_is_a_5xx(client: anthropic.Anthropic) -> None:
    image: Any = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    for messages in (
        [{"role": "user", "content": [image, {"type": "text", "text": "what is this"}]}],
        [{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "https://x.example/a.png"}}]}],
    ):
        with pytest.raises(anthropic.BadRequestError) as refused:
            client.messages.create(model=MODEL, max_tokens=8, messages=messages)
        assert refused.value.status_code == 400
    thinking = client.messages.create(
        model=MODEL, max_tokens=16, messages=ASK, thinking={"type": "enabled", "budget_tokens": 1024}
    )
    assert thinking.stop_reason in ("end_turn", "max_tokens")  # no verified reasoning: answered without

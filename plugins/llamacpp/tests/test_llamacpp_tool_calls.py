"""Tool calls through ``werk serve`` on a real llama-server running the real SmolLM2-135M-Instruct,
with the ``openai`` SDK (docs/compat.md, "OpenAI"; ``werk_llamacpp/tools.py``).

SmolLM2's chat template renders no tools and llama-server enforces no ``tool_choice``, so every
forced call here is Werk's: the call's JSON schema as the backend's constraint, parsed back into
``tool_calls``. A forced call (a named function and ``"required"``, streamed and not) arrives as
one call whose arguments validate against the tool's parameters; its follow-up turn with the
``role: "tool"`` result completes with text; ``/werk/v1/chat/count_tokens`` equals the answer's
``usage.prompt_tokens`` with tools present; ``"auto"`` answers; a call cut by ``max_tokens`` is
``finish_reason: "length"`` with the text, never a made-up call; bad choices are 400s.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
from werk_llamacpp.process import ENV_ARGS

from werk_host.plugin import ModelManifest
from werk_host.testing.api import Api
from werk_host.testing.host import ModelRegistry
from werk_host.testing.hosts import serve_process

pytestmark = pytest.mark.llamaserver
KEY = "sk-werk-tools-test-5531"
MODEL = "smollm2"

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"timezone": {"type": "string"}},
    "required": ["timezone"],
    "additionalProperties": False,
}
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather in a city", "parameters": WEATHER},
    },
    {"type": "function", "function": {"name": "get_time", "description": "Time in a timezone", "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


@dataclass
class Served:
    url: str
    api: Api

    def count(self, **body: Any) -> int:
        status, answer = self.api.post("/werk/v1/chat/count_tokens", {"model": MODEL, **body})
        assert status == 200, answer
        tokens: int = answer["data"]["input_tokens"]
        return tokens

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, llama_server_path: Path, smollm2_gguf: Path) -> Iterator[Served]:
    """``werk serve --model smollm2`` in its own process, keyed."""
    root = tmp_path_factory.mktemp("tools")
    home = root / "home"
    home.mkdir()
    ModelRegistry(home).add(ModelManifest.from_paths(MODEL, [smollm2_gguf], backend="llama.cpp"))
    environ = {"WERK_LLAMA_SERVER": str(llama_server_path)}
    with serve_process(home, "--model", MODEL, keys=(KEY,), env=environ, drop=(ENV_ARGS,)) as served:
        url = served.url
        yield Served(url, Api(url, KEY))


def _valid(value: Any, schema: dict[str, Any]) -> bool:
    """``value`` against the small JSON Schema subset these tools use."""
    if "enum" in schema and value not in schema["enum"]:
        return False
    kind = schema.get("type")
    if kind == "string":
        return isinstance(value, str)
    if kind == "object":
        if not isinstance(value, dict) or not set(schema.get("required", [])) <= set(value):
            return False
        props = schema.get("properties", {})
        if schema.get("additionalProperties") is False and not set(value) <= set(props):
            return False
        return all(_valid(v, props[k]) for k, v in value.items() if k in props)
    return True


@dataclass
class Call:
    id: str
    name: str
    arguments: str
    finish: str | None
    prompt_tokens: int


def _call(served: Served, choice: Any, *, stream: bool, max_tokens: int = 200) -> tuple[Call, str | None]:
    """One forced request; the call (or what came instead) and the answer's text content."""
    options: dict[str, Any] = {
        "model": MODEL,
        "messages": ASK,
        "tools": TOOLS,
        "tool_choice": choice,
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    with served.client() as client:
        if not stream:
            reply = client.chat.completions.create(**options)
            assert reply.usage is not None
            message, finish = reply.choices[0].message, reply.choices[0].finish_reason
            calls = message.tool_calls or []
            assert len(calls) <= 1
            if not calls:
                return Call("", "", "", finish, reply.usage.prompt_tokens), message.content
            call = calls[0]
            assert call.type == "function" and message.content is None
            return Call(call.id, call.function.name, call.function.arguments, finish, reply.usage.prompt_tokens), None
        chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **options))
    usage = chunks[-1].usage
    assert usage is not None and chunks[-1].choices == []
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finishes) == 1
    pieces = [p for d in deltas for p in d.tool_calls or []]
    text = "".join(d.content or "" for d in deltas)
    if not pieces:
        return Call("", "", "", finishes[0], usage.prompt_tokens), text
    first = pieces[0]
    # OpenAI's stream shape: the first piece names the call, the others carry argument fragments
    assert first.index == 0 and first.id and first.type == "function" and first.function and first.function.name
    assert all(p.index == 0 and p.id is None and p.function and p.function.name is None for p in pieces[1:])
    assert not text, "the constrained JSON must not reach the client as text"
    arguments = "".join(p.function.arguments or "" for p in pieces if p.function)
    return Call(first.id, first.function.name, arguments, finishes[0], usage.prompt_tokens), None


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("choice", [NAMED, "required"], ids=["named", "required"])
def test_forced_call_arrives_as_a_valid_tool_call(served: Served, choice: Any, stream: bool) -> None:
    call, text = _call(served, choice, stream=stream)
    assert text is None
    assert call.finish == "tool_calls" and call.id.startswith("call_")
    assert call.name == "get_weather" if choice == NAMED else call.name in SCHEMAS
    arguments = json.loads(call.arguments)
    assert _valid(arguments, SCHEMAS[call.name]), arguments
    # the count renders the body the chat really sent: tools in the prompt, forced
    assert call.prompt_tokens == served.count(messages=ASK, tools=TOOLS, tool_choice=choice)
    assert call.prompt_tokens > served.count(messages=ASK)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_follow_up_turn_after_the_tool_result_answers_text(served: Served, stream: bool) -> None:
    call, _ = _call(served, NAMED, stream=False)
    history = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": "18 degrees celsius and sunny"},
    ]
    options: dict[str, Any] = {"model": MODEL, "messages": history, "tools": TOOLS, "max_tokens": 24, "temperature": 0}
    with served.client() as client:
        if stream:
            chunks = list(
                client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **options)
            )
            usage = chunks[-1].usage
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        else:
            reply = client.chat.completions.create(**options)
            usage, text = reply.usage, reply.choices[0].message.content or ""
            finish = [reply.choices[0].finish_reason]
    assert usage is not None and text.strip() and finish in (["stop"], ["length"])
    counted = served.count(messages=history, tools=TOOLS)
    assert usage.prompt_tokens == counted
    # the call is in the prompt the model saw: SmolLM2's template alone renders it as an empty turn
    no_call = [*ASK, {"role": "assistant", "content": ""}, history[-1]]
    assert counted > served.count(messages=no_call, tools=TOOLS)


def test_auto_with_tools_answers(served: Served) -> None:
    with served.client() as client:
        reply = client.chat.completions.create(
            model=MODEL, messages=ASK, tools=TOOLS, tool_choice="auto", max_tokens=16, temperature=0
        )
    assert reply.usage is not None and reply.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert reply.usage.prompt_tokens == served.count(messages=ASK, tools=TOOLS, tool_choice="auto")


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_forced_call_cut_by_max_tokens_is_length_with_the_text(served: Served, stream: bool) -> None:
    call, text = _call(served, NAMED, stream=stream, max_tokens=3)
    assert call.finish == "length" and not call.id
    assert text is not None and text.lstrip().startswith("{")
    with pytest.raises(ValueError):
        json.loads(text)


def test_bad_forced_choices_are_400(served: Served) -> None:
    with served.client() as client:
        with pytest.raises(openai.BadRequestError) as unknown:
            client.chat.completions.create(
                model=MODEL,
                messages=ASK,
                tools=TOOLS,
                tool_choice={"type": "function", "function": {"name": "nope"}},
                max_tokens=8,
            )
        with pytest.raises(openai.BadRequestError) as constrained:
            client.chat.completions.create(
                model=MODEL,
                messages=ASK,
                tools=TOOLS,
                tool_choice="required",
                response_format={"type": "json_object"},
                max_tokens=8,
            )
    assert "not in tools" in str(unknown.value) and "response_format" in str(constrained.value)

"""Ollama tools, tool calls, tool results, images, ``format`` and options as the OpenAI body the
``/v1`` path takes, and OpenAI tool-call answers (JSON and streamed) as Ollama's."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from werk_host.compat import ollama
from werk_host.compat.ollama_answers import BAD_ARGUMENTS
from werk_host.compat.upstream import sse_events
from werk_host.errors import WerkError
from werk_host.http.ollama import PROBE_PNG
from werk_host.seam import JsonObject

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather in a given city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
#: Ollama's own example conversation (its API reference, "Chat request (With history, with tools)").
HISTORY: list[dict[str, Any]] = [
    {"role": "user", "content": "what is the weather in Toronto?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Toronto"}}}],
    },
    {"role": "tool", "content": "11 degrees celsius", "tool_name": "get_weather"},
]


def _chat(**extra: Any) -> ollama.OllamaChatRequest:
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": False, **extra}
    return ollama.OllamaChatRequest.model_validate(body)


def test_tools_and_a_tool_turn_become_openai_tools_calls_and_results() -> None:
    body = ollama.chat_body(_chat(messages=HISTORY, tools=[{**WEATHER, "items": None}]))
    assert body["tools"] == [WEATHER]
    assert body["messages"] == [
        {"role": "user", "content": "what is the weather in Toronto?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_1_0",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Toronto"}'},
                }
            ],
        },
        {"role": "tool", "content": "11 degrees celsius", "tool_call_id": "call_1_0"},
    ]
    assert ollama.chat_body(_chat(messages=HISTORY)) == ollama.chat_body(_chat(messages=HISTORY))  # the same ids


def test_tool_results_answer_the_call_they_name() -> None:
    calls = [
        {"id": "call_a", "function": {"name": "f", "arguments": {}}},
        {"function": {"name": "g", "arguments": '{"x": 1}'}},  # arguments as JSON text (LiteLLM)
        {"type": "function", "function": {"index": 2, "name": "g", "arguments": {"x": 2}}},
    ]
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "", "tool_calls": calls},
        {"role": "tool", "content": "second g", "tool_name": "g"},
        {"role": "tool", "content": "by id", "tool_call_id": "call_a"},
        {"role": "tool", "content": "in order"},
        {"role": "tool", "content": "answers nothing"},
        {"role": "TOOL", "content": "names its own", "tool_call_id": "call_x"},
    ]
    messages[1]["content"] = None  # as some clients send a call-only turn
    sent = ollama.chat_body(_chat(messages=messages))["messages"]
    assert sent[1]["content"] == "" and [c["id"] for c in sent[1]["tool_calls"]] == ["call_a", "call_1_1", "call_1_2"]
    assert sent[1]["tool_calls"][1]["function"]["arguments"] == '{"x": 1}'
    assert [m["tool_call_id"] for m in sent[2:]] == ["call_1_1", "call_a", "call_1_2", "call_5", "call_x"]


def test_images_become_data_url_parts_after_the_text() -> None:
    body = ollama.chat_body(_chat(messages=[{"role": "user", "content": "what is it?", "images": [PROBE_PNG]}]))
    assert body["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is it?"},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PROBE_PNG}"}},
            ],
        }
    ]
    chat, generated = ollama.generate_body(
        ollama.OllamaGenerateRequest(model="m", prompt="", images=[f"data:image/png;base64,{PROBE_PNG}"])
    )
    assert chat and generated["messages"][-1]["content"] == [
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PROBE_PNG}"}}
    ]


@pytest.mark.parametrize(
    ("messages", "fragment"),
    [
        ([{"role": "assistant", "content": "x", "images": [PROBE_PNG]}], "user messages only"),
        ([{"role": "user", "content": "x", "images": ["%%%"]}], "base64"),
        ([{"role": "user", "content": "x", "tool_calls": [{"function": {"name": "f"}}]}], "assistant messages only"),
        ([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}], "JSON object"),
        ([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 1}}]}], "arguments"),
        ([{"role": "tool", "content": "x", "tool_call_id": 1}], "tool_call_id"),
    ],
)
def test_malformed_tool_turns_and_images_are_refused(messages: list[dict[str, Any]], fragment: str) -> None:
    with pytest.raises(ValidationError) as err:
        _chat(messages=messages)
    assert fragment in str(err.value)


def test_options_format_and_think() -> None:
    options = {
        "num_predict": 5,
        "min_p": 0.05,
        "typical_p": 0.9,
        "repeat_penalty": 1.1,
        "repeat_last_n": 32,
        "num_ctx": 1 << 20,
        "num_keep": 4,
        "mirostat": 2,
        "tfs_z": 1.0,
        "penalize_newline": True,
        "whatever": {"nested": [1]},
    }
    body = ollama.chat_body(_chat(options=options, format={"type": "object"}, think="max"))
    assert body == {
        "model": "m",
        "stream": False,
        "max_tokens": 5,
        "min_p": 0.05,
        "typical_p": 0.9,
        "repeat_penalty": 1.1,
        "repeat_last_n": 32,
        "response_format": {"type": "json_schema", "json_schema": {"name": "response", "schema": {"type": "object"}}},
        "werk": {"reasoning": {"tier": "max"}},
        "messages": [{"role": "user", "content": "hi"}],
    }
    assert "werk" not in ollama.chat_body(_chat(think=False))


def _tool_answer(arguments: str, finish: str = "tool_calls") -> JsonObject:
    """A non-streamed OpenAI answer carrying one call, as llama-server sends it."""
    call = {"type": "function", "function": {"name": "get_weather", "arguments": arguments}, "id": "b3kFq0"}
    message = {"role": "assistant", "content": None, "tool_calls": [call]}
    return {
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 40, "completion_tokens": 9},
    }


def test_a_tool_call_answer_becomes_ollamas() -> None:
    done = ollama.answer(_tool_answer('{"city":"Tokyo"}'), ollama.Shape.CHAT, "m", 0)
    assert done["message"] == {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "b3kFq0", "function": {"index": 0, "name": "get_weather", "arguments": {"city": "Tokyo"}}}
        ],
    }
    assert (done["done"], done["done_reason"], done["eval_count"]) == (True, "stop", 9)
    no_id = _tool_answer("")
    no_id["choices"][0]["message"]["tool_calls"][0].pop("id")
    call = ollama.answer(no_id, ollama.Shape.CHAT, "m", 0)["message"]["tool_calls"][0]
    assert call["function"]["arguments"] == {} and call["id"].startswith("call_") and len(call["id"]) == 13
    with pytest.raises(WerkError) as err:
        ollama.answer(_tool_answer('{"city":'), ollama.Shape.CHAT, "m", 0)
    assert err.value.message == BAD_ARGUMENTS


def _sse(*events: JsonObject) -> bytes:
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"


def _delta(delta: JsonObject, finish: str | None = None) -> JsonObject:
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def _fragment(arguments: str, **head: Any) -> JsonObject:
    return _delta({"tool_calls": [{"index": 0, "function": {"arguments": arguments}, **head}]})


USAGE: JsonObject = {
    "object": "chat.completion.chunk",
    "choices": [],
    "usage": {"prompt_tokens": 40, "completion_tokens": 9},
}


def _lines(*events: JsonObject) -> list[JsonObject]:
    wire = b"".join(ollama.answer_stream(sse_events([_sse(*events)]), ollama.Shape.CHAT, "m", 0))
    return [json.loads(line) for line in wire.decode().splitlines()]


def test_a_streamed_tool_call_is_one_line_once_its_arguments_are_complete() -> None:
    lines = _lines(
        _delta({"role": "assistant", "content": None}),
        _delta({"tool_calls": [{"index": 0, "id": "c1", "type": "function", "function": {"name": "get_weather"}}]}),
        _fragment('{"ci'),
        _fragment('ty": "Tok'),
        _fragment('yo"}'),
        _delta({}, "tool_calls"),
        USAGE,
    )
    assert [line["done"] for line in lines] == [False, True]
    assert lines[0]["message"] == {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "c1", "function": {"index": 0, "name": "get_weather", "arguments": {"city": "Tokyo"}}}],
    }
    assert (lines[1]["done_reason"], lines[1]["prompt_eval_count"], lines[1]["message"]) == (
        "stop",
        40,
        {"role": "assistant", "content": ""},
    )


def test_a_streamed_call_with_broken_arguments_ends_with_an_error_line() -> None:
    lines = _lines(
        _delta({"tool_calls": [{"index": 0, "id": "c1", "type": "function", "function": {"name": "f"}}]}),
        _fragment('{"a": '),
        _delta({}, "tool_calls"),
    )
    assert lines == [{"error": BAD_ARGUMENTS}]

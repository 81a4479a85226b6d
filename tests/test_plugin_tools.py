"""werk_host.plugin.tools: a forced tool choice as a JSON-schema-constrained generation, and the
constrained output parsed back into OpenAI tool calls (JSON answers and streams), checked with
the official ``openai`` SDK's own types. The real-backend side is
plugins/llamacpp/tests/test_llamacpp_tool_calls.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from werk_host.plugin import ErrorCode, InferenceResponse, WerkError
from werk_host.plugin.tools import (
    CALL_ID_PREFIX,
    ForcedCall,
    forced_call,
    has_tool_turns,
    render_history,
)

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather now", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "ping"}},
]
ASK: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
OUTPUT = '{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Paris \\"la belle\\"",\n    "n": [1, 2.5]\n  }\n}'
ARGUMENTS = '{"city":"Paris \\"la belle\\"","n":[1,2.5]}'
USAGE = {"prompt_tokens": 40, "completion_tokens": 30, "total_tokens": 70}


def _forced(choice: Any = NAMED, **body: Any) -> ForcedCall:
    forced = forced_call({"messages": ASK, "tools": TOOLS, "tool_choice": choice, **body})
    assert forced is not None
    return forced


# -- the forced choice and its schema ----------------------------------------------------------


@pytest.mark.parametrize("choice", [None, "auto", "none"])
def test_a_choice_that_forces_nothing_is_none(choice: Any) -> None:
    assert forced_call({"messages": ASK, "tools": TOOLS, "tool_choice": choice}) is None


def test_a_named_function_is_one_call_of_it() -> None:
    schema = _forced().schema()
    assert schema == {
        "type": "object",
        "properties": {"name": {"const": "get_weather"}, "arguments": WEATHER},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def test_required_is_one_call_of_any_tool_whatever_parallel_tool_calls_says() -> None:
    for parallel in (True, False, None):
        schema = _forced("required", parallel_tool_calls=parallel).schema()
        options = schema["anyOf"]
        assert isinstance(options, list) and len(options) == 2
        names = [o["properties"]["name"]["const"] for o in options if isinstance(o, dict)]  # type: ignore[index,call-overload]
        assert names == ["get_weather", "ping"]
    # a function without parameters takes any object
    ping = _forced({"type": "function", "function": {"name": "ping"}}).schema()
    assert ping["properties"] == {"name": {"const": "ping"}, "arguments": {"type": "object"}}


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "not in tools"),
        ({"tool_choice": "required", "tools": []}, "no tools"),
        ({"tool_choice": "required", "tools": None}, "no tools"),
        ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
        ({"tool_choice": NAMED, "grammar": "root ::= x"}, "grammar"),
        ({"tool_choice": "sometimes"}, "tool_choice"),
    ],
)
def test_a_forced_choice_that_cannot_be_made_is_invalid_request(body: dict[str, Any], says: str) -> None:
    with pytest.raises(WerkError) as err:
        forced_call({"messages": ASK, "tools": TOOLS, **body})
    assert err.value.code is ErrorCode.INVALID_REQUEST and says in err.value.message


def test_response_format_text_still_combines() -> None:
    assert _forced(response_format={"type": "text"}).name == "get_weather"


# -- the body the engine gets ------------------------------------------------------------------


def test_the_constrained_body_describes_the_tools_in_the_system_message() -> None:
    body = {"messages": ASK, "tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": True, "stream": True}
    sent = _forced("required").constrained_body(body, render_tools=True)
    assert set(sent) == {"messages", "response_format", "stream"}
    assert sent["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "tool_call", "strict": True, "schema": _forced("required").schema()},
    }
    messages = sent["messages"]
    assert isinstance(messages, list) and messages[1:] == ASK and isinstance(messages[0], dict)
    system = messages[0]["content"]
    assert messages[0]["role"] == "system" and isinstance(system, str)
    assert (
        "- get_weather: Weather now Parameters (JSON Schema): " + json.dumps(WEATHER, separators=(",", ":")) in system
    )
    assert '- ping: Parameters (JSON Schema): {"type":"object"}' in system
    assert "Call one of these functions now." in system
    assert body["tool_choice"] == "required"  # the request itself is left alone


def test_the_instruction_joins_a_system_message_and_names_the_forced_function() -> None:
    conversation = [{"role": "developer", "content": "Be brief."}, *ASK]
    sent = _forced().constrained_body({"messages": conversation, "tools": TOOLS}, render_tools=True)
    messages = sent["messages"]
    assert isinstance(messages, list) and len(messages) == 2 and isinstance(messages[0], dict)
    content = messages[0]["content"]
    assert messages[0]["role"] == "developer" and isinstance(content, str)
    assert content.startswith("Be brief.\n\n") and "Call the function get_weather now." in content
    assert "ping" not in content  # a named choice describes that function only
    # a system message of text parts gets one more part
    parts = [{"role": "system", "content": [{"type": "text", "text": "Hi"}]}, *ASK]
    sent = _forced().constrained_body({"messages": parts, "tools": TOOLS}, render_tools=True)
    messages = sent["messages"]
    assert isinstance(messages, list) and messages[1:] == ASK and isinstance(messages[0], dict)
    added = messages[0]["content"]
    assert isinstance(added, list) and added[0] == {"type": "text", "text": "Hi"} and len(added) == 2
    # a user message first: the instruction goes before it
    sent = _forced().constrained_body({"messages": ASK, "tools": TOOLS}, render_tools=True)
    assert isinstance(sent["messages"], list) and sent["messages"][1:] == ASK


def test_a_template_that_renders_tools_keeps_them() -> None:
    body = {"messages": ASK, "tools": TOOLS, "tool_choice": NAMED, "parallel_tool_calls": False}
    sent = _forced().constrained_body(body, render_tools=False)
    assert sent["messages"] == ASK and sent["tools"] == TOOLS and sent["parallel_tool_calls"] is False
    assert "tool_choice" not in sent and "response_format" in sent


def test_tool_turns_become_text_turns() -> None:
    history: list[Any] = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                },
                {"id": "call_2", "type": "function", "function": {"name": "ping", "arguments": "not json"}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
        {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "pong"}]},
        {"role": "assistant", "content": "Let me check.", "function_call": {"name": "ping", "arguments": "{}"}},
        {"role": "function", "name": "ping", "content": "pong"},
    ]
    assert has_tool_turns(history) and not has_tool_turns(ASK)
    assert render_history(history) == [
        *ASK,
        {
            "role": "assistant",
            "content": '{"name":"get_weather","arguments":{"city":"Paris"}}\n{"name":"ping","arguments":"not json"}',
        },
        {"role": "user", "content": "Result of get_weather (call_1): 18 C"},
        {"role": "user", "content": "Result of ping (call_2): pong"},
        {"role": "assistant", "content": 'Let me check.\n{"name":"ping","arguments":{}}'},
        {"role": "user", "content": "Result of ping: pong"},
    ]


# -- a whole answer ----------------------------------------------------------------------------


def _completion(content: str | None, finish: str = "stop") -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish}],
        "usage": USAGE,
    }


def _response(chunks: list[bytes], status: int = 200) -> tuple[InferenceResponse, list[bool]]:
    closed: list[bool] = []
    return InferenceResponse(status, {"Content-Type": "x"}, iter(chunks), lambda: closed.append(True)), closed


def test_a_json_answer_becomes_the_call() -> None:
    raw = json.dumps(_completion(OUTPUT)).encode()
    response, closed = _response([raw[:50], raw[50:]])
    relayed = _forced().relay(response, stream=False)
    assert closed == [True] and relayed.status == 200
    body = b"".join(relayed.body)
    assert relayed.headers["Content-Length"] == str(len(body))
    answer = ChatCompletion.model_validate_json(body)
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert choice.message.tool_calls is not None and len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.id.startswith(CALL_ID_PREFIX) and len(call.id) == 29
    assert call.function.name == "get_weather" and call.function.arguments == ARGUMENTS
    assert json.loads(call.function.arguments) == json.loads(OUTPUT)["arguments"]
    assert answer.usage is not None and answer.usage.model_dump(exclude_none=True) == USAGE


def test_call_ids_are_fresh() -> None:
    ids = set()
    for _ in range(3):
        answer = _forced().answer(_completion(OUTPUT))
        ids.add(answer["choices"][0]["message"]["tool_calls"][0]["id"])  # type: ignore[index,call-overload]
    assert len(ids) == 3


def test_a_json_answer_cut_short_is_length_with_the_text() -> None:
    cut = _completion('{\n  "name": "get_weather",\n  "argu', "length")
    assert _forced().answer(cut) == cut


@pytest.mark.parametrize(
    "content",
    [
        '{"name": "get_weather", "argu',  # cut by a stop sequence
        '{"name": "ping", "arguments": {}}',  # not the function forced
        '{"name": "get_weather", "arguments": {}, "extra": 1}',
        "Paris is sunny.",
        None,
    ],
)
def test_a_json_answer_that_is_not_the_call_is_a_typed_error(content: str | None) -> None:
    with pytest.raises(WerkError) as err:
        _forced().answer(_completion(content))
    assert err.value.code is ErrorCode.UNAVAILABLE and "did not complete the forced tool call" in err.value.message


def test_an_error_answer_passes_untouched() -> None:
    response, closed = _response([b'{"error": {"message": "bad"}}'], status=400)
    assert _forced().relay(response, stream=False) is response and closed == []


def test_an_answer_that_is_not_json_is_unavailable() -> None:
    response, closed = _response([b"<html>"])
    with pytest.raises(WerkError) as err:
        _forced().relay(response, stream=False)
    assert err.value.code is ErrorCode.UNAVAILABLE and closed == [True]


# -- a stream ----------------------------------------------------------------------------------


def _chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
    doc = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        **extra,
    }
    return f"data: {json.dumps(doc)}\n\n".encode()


USAGE_CHUNK = (
    b'data: {"choices":[],"created":1,"id":"chatcmpl-1","model":"m","object":"chat.completion.chunk",'
    b'"usage":{"prompt_tokens":40,"completion_tokens":30,"total_tokens":70}}\n\n'
)


def _engine_stream(text: str, finish: str = "stop", step: int = 3) -> list[bytes]:
    pieces = [text[i : i + step] for i in range(0, len(text), step)]
    events = [_chunk({"role": "assistant", "content": None})]
    events += [_chunk({"content": p}) for p in pieces]
    events += [_chunk({}, finish, timings={"predicted_n": 30}), USAGE_CHUNK, b"data: [DONE]\n\n"]
    return events


def _split(events: list[bytes], size: int) -> Iterator[bytes]:
    """The events' bytes in pieces of ``size``: event boundaries fall anywhere."""
    data = b"".join(events)
    return (data[i : i + size] for i in range(0, len(data), size))


def _read(out: bytes) -> tuple[list[ChatCompletionChunk], list[bytes]]:
    events = [e + b"\n\n" for e in out.split(b"\n\n") if e]
    chunks = [ChatCompletionChunk.model_validate_json(e[len(b"data: ") :]) for e in events if e != b"data: [DONE]\n\n"]
    return chunks, events


@pytest.mark.parametrize("size", [1, 7, 4096])
def test_a_stream_becomes_tool_call_deltas(size: int) -> None:
    forced = _forced()
    response, closed = _response(list(_split(_engine_stream(OUTPUT), size)))
    relayed = forced.relay(response, stream=True)
    out = b"".join(relayed.body)
    relayed.close()
    assert closed == [True]
    chunks, events = _read(out)
    assert events[-2:] == [USAGE_CHUNK, b"data: [DONE]\n\n"]  # the engine's usage, byte for byte
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content is None
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert all(d.content is None for d in deltas)  # the JSON fragments never reach the client as text
    pieces = [p for d in deltas for p in d.tool_calls or []]
    head = pieces[0]
    assert head.index == 0 and head.type == "function" and head.id and head.id.startswith(CALL_ID_PREFIX)
    assert head.function is not None and head.function.name == "get_weather" and head.function.arguments == ""
    rest = pieces[1:]
    assert len(rest) > 1 and all(p.id is None and p.function and p.function.name is None for p in rest)
    assert "".join(p.function.arguments or "" for p in rest if p.function) == ARGUMENTS
    finishes = [(c.choices[0].finish_reason, c.model_extra) for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [("tool_calls", {"timings": {"predicted_n": 30}})]


def test_a_stream_with_arguments_before_the_name_starts_the_call_at_the_name() -> None:
    output = '{"arguments": {"city": "Oslo"}, "name": "get_weather"}'
    response, _ = _response(_engine_stream(output, step=2))
    chunks, _ = _read(b"".join(_forced().relay(response, stream=True).body))
    pieces = [p for c in chunks if c.choices for p in c.choices[0].delta.tool_calls or []]
    assert pieces[0].function is not None and pieces[0].function.name == "get_weather"
    assert "".join(p.function.arguments or "" for p in pieces if p.function) == '{"city":"Oslo"}'


def test_a_stream_cut_before_the_name_is_length_with_the_text() -> None:
    response, _ = _response(_engine_stream('{\n  "na', finish="length"))
    chunks, events = _read(b"".join(_forced().relay(response, stream=True).body))
    deltas = [c.choices[0] for c in chunks if c.choices]
    assert not any(d.delta.tool_calls for d in deltas)
    assert "".join(d.delta.content or "" for d in deltas) == '{\n  "na'
    assert [d.finish_reason for d in deltas if d.finish_reason] == ["length"] and events[-2] == USAGE_CHUNK


def test_a_stream_cut_inside_the_arguments_ends_the_begun_call_with_length() -> None:
    response, _ = _response(_engine_stream('{"name": "get_weather", "arguments": {"ci', finish="length"))
    chunks, _ = _read(b"".join(_forced().relay(response, stream=True).body))
    deltas = [c.choices[0] for c in chunks if c.choices]
    pieces = [p for d in deltas for p in d.delta.tool_calls or []]
    assert "".join(p.function.arguments or "" for p in pieces if p.function) == '{"ci'
    assert [d.finish_reason for d in deltas if d.finish_reason] == ["length"]


@pytest.mark.parametrize("output", ['{"name": "get_weather", "arguments": {"ci', "no JSON at all"])
def test_a_stream_that_stops_without_the_call_ends_with_a_typed_error(output: str) -> None:
    response, _ = _response(_engine_stream(output))
    with pytest.raises(WerkError) as err:
        b"".join(_forced().relay(response, stream=True).body)
    assert err.value.code is ErrorCode.UNAVAILABLE


def test_other_delta_fields_pass_without_the_text() -> None:
    events = _engine_stream(OUTPUT)
    events.insert(1, _chunk({"reasoning_content": "Paris, so get_weather."}))
    response, _ = _response(events)
    chunks, _ = _read(b"".join(_forced().relay(response, stream=True).body))
    thinking = [c.choices[0].delta.model_extra for c in chunks if c.choices and c.choices[0].delta.model_extra]
    assert thinking == [{"reasoning_content": "Paris, so get_weather."}]


def test_stream_errors_and_other_events_pass_through() -> None:
    error = b'data: {"error": {"message": "x", "type": "server_error"}}\n\n'
    response, _ = _response([b": keep-alive\n\n", error, b"data: [DONE]\n\n"])
    assert b"".join(_forced().relay(response, stream=True).body) == b": keep-alive\n\n" + error + b"data: [DONE]\n\n"

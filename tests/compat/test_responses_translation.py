"""The Responses API translation (werk_host/compat/responses*.py) without a server: requests as
Codex CLI and the openai SDK send them become the OpenAI chat body, and OpenAI chat answers
(JSON and chunks, shaped as the ``/v1`` path returns them) become the ``response`` object and
the event stream, each checked against the openai SDK's own pydantic types."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter, ValidationError

from werk_host.compat.responses import ResponsesRequest, chat_body, effort_tier
from werk_host.compat.responses_answer import response_object, response_stream
from werk_host.compat.upstream import STREAM_CUT, STREAM_FAILED
from werk_host.errors import WerkError
from werk_host.protocol import ChatRequest

FIXTURES = Path(__file__).parent / "fixtures"
#: The first request of @openai/codex 0.171.0 (`codex exec "say hi"`), recorded.
CODEX_FIRST = FIXTURES / "agents" / "codex_responses.json"
#: Codex's shape mid-conversation: a reasoning item, a call and its output passed back.
CODEX_FOLLOWUP = FIXTURES / "codex_request_followup.json"
EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)


def _fixture(path: Path) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(path.read_text())["body"]
    return body


def _request(**fields: Any) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"model": "tiny", **fields})


# -- requests ----------------------------------------------------------------------------------------


def test_codex_first_request_becomes_one_system_message_its_turns_and_its_function_tools() -> None:
    raw = _fixture(CODEX_FIRST)
    body = chat_body(ResponsesRequest.model_validate(raw))
    developer = [p["text"] for i in raw["input"] if i["role"] == "developer" for p in i["content"]]
    users = [i for i in raw["input"] if i["role"] == "user"]
    assert (
        len(developer) == 3
        and len(users) == 2
        and raw["input"][:2] == [i for i in raw["input"] if i["role"] == "developer"]
    )
    assert body["messages"] == [
        {"role": "system", "content": "\n\n".join(developer)},
        *({"role": "user", "content": [{"type": "text", "text": p["text"]} for p in u["content"]]} for u in users),
    ]
    functions = [t for t in raw["tools"] if t["type"] == "function"]
    assert {t["type"] for t in raw["tools"]} == {"function", "namespace", "web_search"}
    assert body["tools"] == [
        {
            "type": "function",
            "function": {k: t[k] for k in ("name", "description", "parameters", "strict")},
        }
        for t in functions
    ]
    assert body["tool_choice"] == "auto" and body["parallel_tool_calls"] is True
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert "max_tokens" not in body and "werk" not in body
    ChatRequest.model_validate(body)  # what /v1/chat/completions and count_tokens take


def test_codex_followup_passes_calls_and_their_outputs_back_and_drops_reasoning() -> None:
    raw = _fixture(CODEX_FOLLOWUP)
    body = chat_body(ResponsesRequest.model_validate(raw))
    call = next(i for i in raw["input"] if i["type"] == "function_call")
    output = next(i for i in raw["input"] if i["type"] == "function_call_output")
    assert [m["role"] for m in body["messages"]] == ["system", "user", "user", "assistant", "tool", "assistant", "user"]
    assert body["messages"][3] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": call["call_id"],
                "type": "function",
                "function": {"name": "exec_command", "arguments": call["arguments"]},
            }
        ],
    }
    assert body["messages"][4] == {"role": "tool", "tool_call_id": call["call_id"], "content": output["output"]}
    assert body["messages"][5] == {
        "role": "assistant",
        "content": [{"type": "text", "text": raw["input"][6]["content"][0]["text"]}],
    }
    assert [t["function"]["name"] for t in body["tools"]] == ["exec_command"]
    ChatRequest.model_validate(body)


def test_instructions_a_string_input_and_the_sampling_fields() -> None:
    body = chat_body(
        _request(
            instructions="be brief",
            input="hello",
            max_output_tokens=12,
            temperature=0.5,
            top_p=0.9,
            metadata={"k": "v"},
            prompt_cache_key="abc",
            safety_identifier="u1",
            service_tier="auto",
            truncation="disabled",
            include=["reasoning.encrypted_content"],
            text={"verbosity": "low", "format": {"type": "text"}},
            reasoning={"summary": "auto"},
            store=False,
        )
    )
    assert body == {
        "model": "tiny",
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}],
        "max_tokens": 12,
        "temperature": 0.5,
        "top_p": 0.9,
    }


def test_a_late_developer_message_stays_a_system_message_in_place_and_calls_join_the_assistant_turn() -> None:
    call = {"type": "function_call", "name": "f", "arguments": "{}"}
    body = chat_body(
        _request(
            input=[
                {"role": "user", "content": "q"},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "let me look"}]},
                {**call, "call_id": "c1"},
                {**call, "call_id": "c2"},
                {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "one"}]},
                {"type": "function_call_output", "call_id": "c2", "output": "two"},
                {"role": "developer", "content": "now answer"},
            ]
        )
    )
    calls = [{"id": c, "type": "function", "function": {"name": "f", "arguments": "{}"}} for c in ("c1", "c2")]
    assert body["messages"] == [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [{"type": "text", "text": "let me look"}], "tool_calls": calls},
        {"role": "tool", "tool_call_id": "c1", "content": "one"},
        {"role": "tool", "tool_call_id": "c2", "content": "two"},
        {"role": "system", "content": "now answer"},
    ]


def test_images_become_image_url_parts() -> None:
    image = {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "low"}
    body = chat_body(_request(input=[{"role": "user", "content": [{"type": "input_text", "text": "what?"}, image]}]))
    assert body["messages"][0]["content"] == [
        {"type": "text", "text": "what?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}},
    ]
    call = {"type": "function_call", "call_id": "c", "name": "look", "arguments": "{}"}
    result = _request(input=[call, {"type": "function_call_output", "call_id": "c", "output": [image]}])
    assert chat_body(result)["messages"][1]["content"][0]["type"] == "image_url"
    with pytest.raises(WerkError, match="cannot carry images"):
        chat_body(_request(input=[{"role": "developer", "content": [image]}, {"role": "user", "content": "x"}]))


FUNCTION = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ("auto", "auto"),
        ("none", "none"),
        ("required", "required"),
        ({"type": "function", "name": "get_weather"}, {"type": "function", "function": {"name": "get_weather"}}),
        (
            {"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "get_weather"}]},
            "required",
        ),
    ],
)
def test_tool_choice_maps_onto_the_chat_choice(choice: Any, expected: Any) -> None:
    other = {"type": "function", "name": "other"}
    body = chat_body(_request(input="hi", tools=[FUNCTION, other, {"type": "web_search"}], tool_choice=choice))
    assert body["tool_choice"] == expected
    names = [t["function"]["name"] for t in body["tools"]]
    assert names == (["get_weather"] if isinstance(choice, dict) and "tools" in choice else ["get_weather", "other"])


def test_a_choice_that_cannot_be_honoured_is_refused() -> None:
    with pytest.raises(WerkError, match="no function tool is named 'nope'"):
        chat_body(_request(input="hi", tools=[FUNCTION], tool_choice={"type": "function", "name": "nope"}))
    with pytest.raises(WerkError, match="needs at least one function tool"):
        chat_body(_request(input="hi", tools=[{"type": "web_search"}], tool_choice="required"))
    # only ignored tools and auto: no tools at all
    assert "tools" not in chat_body(_request(input="hi", tools=[{"type": "web_search"}], tool_choice="auto"))


def test_text_format_becomes_the_response_format() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    json_schema = {"type": "json_schema", "name": "answer", "schema": schema, "strict": True}
    body = chat_body(_request(input="hi", text={"format": json_schema}))
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "answer", "schema": schema, "strict": True},
    }
    assert chat_body(_request(input="hi", text={"format": {"type": "json_object"}}))["response_format"] == {
        "type": "json_object"
    }


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"store": True}, "store: true is not supported"),
        ({"previous_response_id": "resp_1"}, "previous_response_id is not supported"),
        ({"conversation": "conv_1"}, "conversation is not supported"),
        ({"background": True}, "background is not supported"),
        ({"tools": [{"type": "file_search", "vector_store_ids": ["v"]}]}, "tools of type 'file_search'"),
        ({"tools": [{"type": "function", "name": "bad name"}]}, "tools.0.function.name"),
        ({"tool_choice": {"type": "web_search_preview"}}, "forcing a tool of type 'web_search_preview'"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "'item_reference' are not supported"),
        ({"input": [{"type": "custom_tool_call_output", "call_id": "c", "output": "x"}]}, "'custom_tool_call_output'"),
        ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "'input_file'"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]}, "needs image_url"),
        ({"text": {"format": {"type": "json_schema"}}}, "needs name and schema"),
        ({"top_logprobs": 3}, "top_logprobs is not supported"),
        ({"moderation": {"model": "x"}}, "moderation"),
    ],
)
def test_what_the_translation_cannot_honour_is_refused(fields: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValidationError) as refused:
        _request(**{"input": "hi", **fields})
    assert fragment in str(refused.value)


def test_an_empty_conversation_is_refused() -> None:
    with pytest.raises(WerkError, match="no messages"):
        chat_body(_request(input=[{"type": "reasoning", "summary": []}]))


def test_reasoning_effort_names_a_werk_tier() -> None:
    assert effort_tier(_request(input="hi")) is None
    assert effort_tier(_request(input="hi", reasoning={"summary": "auto"})) is None
    assert [effort_tier(_request(input="hi", reasoning={"effort": e})) for e in ("minimal", "medium", "xhigh")] == [
        "low",
        "medium",
        "max",
    ]
    assert chat_body(_request(input="hi"), "medium")["werk"] == {"reasoning": {"tier": "medium"}}


# -- answers -------------------------------------------------------------------------------------------


def _completion(message: dict[str, Any], finish: str = "stop", usage: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}],
        "usage": usage or {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16},
    }


def test_an_answer_with_reasoning_text_and_calls_becomes_the_response_object() -> None:
    request = _request(input="hi", tools=[FUNCTION], instructions="be brief", metadata={"a": "b"})
    call = {"id": "call_9", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}
    usage = {
        "prompt_tokens": 11,
        "completion_tokens": 5,
        "prompt_tokens_details": {"cached_tokens": 4},
        "completion_tokens_details": {"reasoning_tokens": 2},
    }
    doc = response_object(
        _completion(
            {"content": "Let me check.", "reasoning_content": "think", "tool_calls": [call]}, "tool_calls", usage
        ),
        request,
    )
    parsed = Response.model_validate(doc)
    assert parsed.status == "completed" and parsed.incomplete_details is None and parsed.id.startswith("resp_")
    assert parsed.output_text == "Let me check."
    assert [item.type for item in parsed.output] == ["reasoning", "message", "function_call"]
    assert doc["output"][0]["content"] == [{"type": "reasoning_text", "text": "think"}]
    assert {k: doc["output"][2][k] for k in ("call_id", "name", "arguments", "status")} == {
        "call_id": "call_9",
        "name": "get_weather",
        "arguments": '{"city":"Paris"}',
        "status": "completed",
    }
    assert doc["usage"] == {
        "input_tokens": 11,
        "input_tokens_details": {"cached_tokens": 4, "cache_write_tokens": 0},
        "output_tokens": 5,
        "output_tokens_details": {"reasoning_tokens": 2},
        "total_tokens": 16,
    }
    assert doc["instructions"] == "be brief" and doc["metadata"] == {"a": "b"} and doc["store"] is False
    assert doc["tools"] == [FUNCTION] and doc["tool_choice"] == "auto" and doc["parallel_tool_calls"] is True


def test_a_length_finish_is_an_incomplete_response() -> None:
    doc = response_object(_completion({"content": "cut"}, "length"), _request(input="hi", max_output_tokens=5))
    assert doc["status"] == "incomplete" and doc["incomplete_details"] == {"reason": "max_output_tokens"}
    assert doc["output"][0]["status"] == "incomplete" and doc["max_output_tokens"] == 5
    Response.model_validate(doc)


# -- streams -------------------------------------------------------------------------------------------


def _chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


USAGE_CHUNK = {"object": "chat.completion.chunk", "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}}


def _events(chunks: list[dict[str, Any]], request: ResponsesRequest | None = None) -> list[dict[str, Any]]:
    """The translated stream, each event checked against the SDK's event types."""
    events = []
    for raw in response_stream(iter(chunks), request or _request(input="hi", stream=True)):
        name, data = raw.decode().removesuffix("\n\n").split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert name == f"event: {event['type']}"
        EVENTS.validate_python(event)
        events.append(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events


def test_a_text_stream_follows_the_responses_event_sequence() -> None:
    events = _events(
        [
            _chunk({"role": "assistant", "content": ""}),
            _chunk({"content": "Hel"}),
            _chunk({"content": "lo"}),
            _chunk({}, "stop"),
            USAGE_CHUNK,
        ]
    )
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert events[6]["text"] == "Hello"
    final = Response.model_validate(events[-1]["response"])
    assert final.output_text == "Hello" and final.status == "completed"
    assert final.usage is not None and (final.usage.input_tokens, final.usage.output_tokens) == (7, 3)
    assert events[-1]["response"]["output"] == [events[8]["item"]]
    assert events[0]["response"]["id"] == events[-1]["response"]["id"]


def test_reasoning_then_text_then_two_streamed_calls() -> None:
    def call(index: int, **fields: Any) -> dict[str, Any]:
        return _chunk({"tool_calls": [{"index": index, **fields}]})

    chunks = [
        _chunk({"reasoning_content": "hmm"}),
        _chunk({"content": "Checking."}),
        call(0, id="call_a", type="function", function={"name": "get_weather", "arguments": ""}),
        call(0, function={"arguments": '{"city":'}),
        call(0, function={"arguments": '"Paris"}'}),
        call(1, id="call_b", type="function", function={"name": "get_weather", "arguments": '{"city":"Rome"}'}),
        _chunk({}, "tool_calls"),
        USAGE_CHUNK,
    ]
    events = _events(chunks)
    kinds = [e["type"] for e in events]
    assert kinds.count("response.reasoning_text.delta") == 1 and kinds.count("response.output_text.delta") == 1
    deltas = [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"]
    assert deltas == ['{"city":', '"Paris"}', '{"city":"Rome"}']
    done = {e["item_id"]: e["arguments"] for e in events if e["type"] == "response.function_call_arguments.done"}
    assert sorted(done.values()) == ['{"city":"Paris"}', '{"city":"Rome"}']
    final = events[-1]["response"]
    assert [(i["type"], i.get("call_id")) for i in final["output"]] == [
        ("reasoning", None),
        ("message", None),
        ("function_call", "call_a"),
        ("function_call", "call_b"),
    ]
    added = [e for e in events if e["type"] == "response.output_item.added"]
    assert [e["output_index"] for e in added] == [0, 1, 2, 3]
    # a call item is announced with the identity it keeps (the SDK checks it at output_item.done)
    assert [(e["item"].get("call_id"), e["item"].get("name")) for e in added[2:]] == [
        ("call_a", "get_weather"),
        ("call_b", "get_weather"),
    ]
    assert [e["item"]["id"] for e in added] == [i["id"] for i in final["output"]]
    assert final["output"][0]["content"] == [{"type": "reasoning_text", "text": "hmm"}]
    Response.model_validate(final)


def test_a_length_finish_ends_with_response_incomplete() -> None:
    events = _events([_chunk({"content": "cut"}), _chunk({}, "length"), USAGE_CHUNK])
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert events[-1]["response"]["output"][0]["status"] == "incomplete"


def _broken() -> Iterator[dict[str, Any]]:
    yield _chunk({"content": "par"})
    raise OSError("connection reset by /srv/secret")


@pytest.mark.parametrize(
    ("chunks", "message"),
    [
        ([_chunk({"content": "x"}), {"error": {"message": "llama_decode failed at /srv/x.gguf"}}], STREAM_FAILED),
        ([_chunk({"content": "x"})], STREAM_CUT),
    ],
)
def test_a_failure_inside_the_stream_ends_it_with_response_failed(chunks: list[dict[str, Any]], message: str) -> None:
    events = _events(chunks)
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["status"] == "failed"
    assert events[-1]["response"]["error"] == {"code": "server_error", "message": message}
    assert "srv" not in json.dumps(events)


def test_a_broken_connection_ends_the_stream_with_response_failed() -> None:
    raw = b"".join(response_stream(_broken(), _request(input="hi", stream=True)))
    last = json.loads(raw.decode().strip().split("\n\n")[-1].split("\n")[1].removeprefix("data: "))
    assert last["type"] == "response.failed" and last["response"]["error"]["message"] == STREAM_FAILED
    assert b"srv" not in raw

"""The Anthropic translation for agents, without a server: tools and tool choice, tool use and
tool result turns, mid-conversation system messages, thinking, images, structured output, and
the answers (JSON and streamed) with thinking and tool_use blocks, read back by the official
``anthropic`` SDK's own types."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import pytest
from anthropic.lib.streaming._messages import accumulate_event
from pydantic import TypeAdapter, ValidationError

from werk_host.compat import anthropic as translation
from werk_host.compat.upstream import sse_events
from werk_host.errors import WerkError
from werk_host.protocol import ChatRequest
from werk_host.seam import JsonObject
from werk_host.service.reasoning import budget_profile, unsupported_profile

FIXTURE = Path(__file__).parent / "fixtures" / "claude_code_request.json"
SCHEMA_2020 = "https://json-schema.org/draft/2020-12/schema"
READ: dict[str, Any] = {
    "name": "Read",
    "description": "Read a file",
    "input_schema": {
        "$schema": SCHEMA_2020,
        "type": "object",
        "properties": {"file_path": {"type": "string"}},
        "required": ["file_path"],
        "additionalProperties": False,
    },
    "cache_control": {"type": "ephemeral", "ttl": "1h"},
}
GREP: dict[str, Any] = {"name": "Grep", "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}}}


def _request(**extra: Any) -> translation.MessagesRequest:
    body: dict[str, Any] = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}], **extra}
    return translation.MessagesRequest.model_validate(body)


def _counted(request: translation.MessagesRequest, tier: str | None = None) -> JsonObject:
    """What count_tokens counts, as the JSON the adapter serializes."""
    dumped: JsonObject = translation.count_request(request, tier).model_dump(mode="json", exclude_none=True)
    return dumped


# -- requests ------------------------------------------------------------------------------------


def test_tools_become_function_tools_without_schema_dialect() -> None:
    body = translation.chat_body(_request(tools=[READ, GREP]))
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "Read",
                "description": "Read a file",
                "parameters": {
                    "type": "object",
                    "properties": {"file_path": {"type": "string"}},
                    "required": ["file_path"],
                    "additionalProperties": False,
                },
            },
        },
        {"type": "function", "function": {"name": "Grep", "parameters": GREP["input_schema"]}},
    ]
    assert "tool_choice" not in body and "parallel_tool_calls" not in body
    ChatRequest.model_validate(body)  # what /v1 admission checks


@pytest.mark.parametrize(
    ("choice", "openai", "parallel"),
    [
        ({"type": "auto"}, "auto", None),
        ({"type": "any"}, "required", None),
        ({"type": "tool", "name": "Grep"}, {"type": "function", "function": {"name": "Grep"}}, None),
        ({"type": "none"}, "none", None),
        ({"type": "any", "disable_parallel_tool_use": True}, "required", False),
        ({"type": "tool", "name": "Read", "disable_parallel_tool_use": True}, None, False),
        ({"type": "auto", "disable_parallel_tool_use": False}, "auto", None),
    ],
)
def test_tool_choice_maps_onto_openai(choice: dict[str, Any], openai: Any, parallel: bool | None) -> None:
    body = translation.chat_body(_request(tools=[READ, GREP], tool_choice=choice))
    if openai is not None:
        assert body["tool_choice"] == openai
    assert body.get("parallel_tool_calls") == parallel
    assert _counted(_request(tools=[READ, GREP], tool_choice=choice))["tool_choice"] == body["tool_choice"]


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ({"tool_choice": {"type": "any"}}, "needs tools"),
        ({"tools": [GREP], "tool_choice": {"type": "tool", "name": "Read"}}, "no tool of that name"),
        ({"tools": [GREP], "tool_choice": {"type": "tool"}}, '"name" goes with type "tool"'),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "server tool"),
        ({"tools": [{"type": "bash_20250124", "name": "bash"}]}, "server tool"),
        ({"tools": [{"name": "x", "input_schema": {"type": "array"}}]}, '"type": "object"'),
        ({"tools": [{"name": "a b", "input_schema": {"type": "object"}}]}, "name"),
        ({"mcp_servers": [{"type": "url", "url": "https://mcp.example", "name": "m"}]}, "no MCP servers"),
        ({"compaction": {"type": "auto"}}, "compaction"),
        ({"thinking": {"type": "enabled", "budget_tokens": 512}}, "budget_tokens"),
        ({"thinking": {"type": "sometimes"}}, "thinking"),
        ({"output_config": {"effort": "extreme"}}, "effort"),
        ({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]}, "'document' blocks"),
        (
            {"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "x", "input": {}}]}]},
            "'tool_use' blocks",
        ),
        (
            {"messages": [{"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t"}]}]},
            "'tool_result' blocks",
        ),
        ({"messages": [{"role": "system", "content": [{"type": "image"}]}]}, "'image' blocks"),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}],
                    }
                ]
            },
            "Werk fetches no URLs",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image", "source": {"type": "file", "file_id": "f"}}]}
                ]
            },
            "no Files API",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "image", "source": {"type": "base64", "media_type": "image/bmp", "data": "AA=="}}
                        ],
                    }
                ]
            },
            "media_type",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image"}]}],
                    }
                ]
            },
            "only text",
        ),
        ({"unknown_field": 1}, "unknown_field"),
    ],
)
def test_what_werk_cannot_honour_is_refused_by_name(extra: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValidationError) as err:
        _request(**extra)
    assert fragment in str(err.value)


def test_a_tool_conversation_becomes_openai_turns_in_order() -> None:
    request = _request(
        system="be brief",
        tools=[READ],
        messages=[
            {"role": "user", "content": "read a.txt"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "I should read it", "signature": "sig"},
                    {"type": "redacted_thinking", "data": "opaque"},
                    {"type": "text", "text": "Reading."},
                    {"type": "tool_use", "id": "toolu_01A", "name": "Read", "input": {"file_path": "a.txt"}},
                    {"type": "tool_use", "id": "toolu_01B", "name": "Read", "input": {"file_path": "b.txt"}},
                ],
            },
            {"role": "system", "content": "The user may interrupt."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "here:"},
                    {"type": "tool_result", "tool_use_id": "toolu_01A", "content": "alpha"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_01B",
                        "content": [
                            {"type": "text", "text": "no such"},
                            {"type": "tool_reference", "tool_name": "Grep"},
                            {"type": "text", "text": "file"},
                        ],
                        "is_error": True,
                        "cache_control": {"type": "ephemeral"},
                    },
                ],
            },
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "only thinking", "signature": "s"}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01C"}]},
        ],
    )
    body = translation.chat_body(request)
    assert body["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "read a.txt"},
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "Reading."}],
            "tool_calls": [
                {
                    "id": "toolu_01A",
                    "type": "function",
                    "function": {"name": "Read", "arguments": '{"file_path":"a.txt"}'},
                },
                {
                    "id": "toolu_01B",
                    "type": "function",
                    "function": {"name": "Read", "arguments": '{"file_path":"b.txt"}'},
                },
            ],
        },
        {"role": "system", "content": "The user may interrupt."},
        {"role": "tool", "tool_call_id": "toolu_01A", "content": "alpha"},
        {"role": "tool", "tool_call_id": "toolu_01B", "content": "Error: no such\nGrep\nfile"},
        {"role": "user", "content": [{"type": "text", "text": "here:"}]},
        {"role": "tool", "tool_call_id": "toolu_01C", "content": ""},
    ]
    assert "thinking" not in json.dumps(body["messages"]) and "opaque" not in json.dumps(body)
    assert _counted(request)["messages"] == body["messages"]  # the count renders what the chat sends
    ChatRequest.model_validate(body)


def test_base64_images_become_data_url_parts() -> None:
    image = {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}
    request = _request(
        messages=[{"role": "user", "content": [{"type": "image", "source": image}, {"type": "text", "text": "what?"}]}]
    )
    assert translation.chat_body(request)["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
                {"type": "text", "text": "what?"},
            ],
        }
    ]


def test_structured_output_and_ignored_fields() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    quiet = _request(
        output_config={"effort": "high", "format": {"type": "json_schema", "schema": schema}},
        context_management={"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        service_tier="auto",
        container="container_01",
        inference_geo="eu",
        speed="standard",
        mcp_servers=[],
        metadata={"user_id": "u"},
        cache_control={"type": "ephemeral", "ttl": "5m"},
        diagnostics={"previous_message_id": "msg_1"},
    )
    body = translation.chat_body(quiet)
    assert body == {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 64,
        "response_format": {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}},
    }
    older = translation.chat_body(_request(output_format={"type": "json_schema", "schema": schema}))
    assert older["response_format"] == body["response_format"]


def test_thinking_maps_onto_the_verified_reasoning_profile() -> None:
    def profile(output: int) -> Any:
        return budget_profile(
            model="m", backend="b", context_tokens=None, output_tokens=output, launch_budget=-1, thinking_enabled=True
        )

    tier = translation.thinking_tier
    enabled = translation.MessagesRequest.model_validate(
        {
            "model": "m",
            "max_tokens": 9000,
            "messages": [{"role": "user", "content": "x"}],
            "thinking": {"type": "enabled", "budget_tokens": 3000},
        }
    ).thinking
    adaptive = _request(thinking={"type": "adaptive", "display": "omitted"}).thinking
    disabled = _request(thinking={"type": "disabled"}).thinking
    unverified = unsupported_profile("m", "b")
    assert tier(enabled, profile(9000)) == "high"  # 2048 ≤ 3000 < 4096
    assert tier(enabled, profile(900)) == "default"  # no thinking tier fits this output: never a refusal
    assert tier(enabled, unverified) == tier(enabled, None) == "default"
    assert tier(adaptive, profile(9000)) == tier(adaptive, unverified) == "default"
    assert tier(disabled, profile(9000)) == "none"
    assert tier(disabled, unverified) is None and tier(None, profile(9000)) is None
    body = translation.chat_body(_request(thinking={"type": "adaptive"}), "default")
    assert body["werk"] == {"reasoning": {"tier": "default"}}
    counted = translation.count_request(_request(thinking={"type": "adaptive"}), "default", 4096)
    assert counted.werk is not None and counted.werk.reasoning is not None
    assert (counted.werk.reasoning.tier, counted.max_tokens) == ("default", 4096)


def test_the_recorded_claude_code_request_translates() -> None:
    recorded = json.loads(FIXTURE.read_text())
    body = recorded["body"]
    assert len(body["tools"]) >= 20 and all(t["input_schema"]["$schema"] == SCHEMA_2020 for t in body["tools"])
    request = translation.MessagesRequest.model_validate(body)
    chat = translation.chat_body(request, translation.thinking_tier(request.thinking, None))
    assert [m["role"] for m in chat["messages"]] == ["system", "user", "system"]
    assert len(chat["tools"]) == len(body["tools"]) and "$schema" not in json.dumps(chat["tools"])
    assert chat["werk"] == {"reasoning": {"tier": "default"}} and chat["max_tokens"] == 32000
    assert chat["stream"] is True and chat["stream_options"] == {"include_usage": True}
    ChatRequest.model_validate(chat)
    assert _counted(request, "default")["tools"] == chat["tools"]


# -- answers -------------------------------------------------------------------------------------


def _completion(message: JsonObject, finish: str) -> JsonObject:
    return {
        "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}],
        "usage": {"prompt_tokens": 30, "completion_tokens": 9},
    }


CALLS: list[JsonObject] = [
    {"id": "call_abc", "type": "function", "function": {"name": "Read", "arguments": '{"file_path": "a.txt"}'}},
    {"id": "toolu_kept", "type": "function", "function": {"name": "Grep", "arguments": ""}},
    {"id": "x.y/z", "type": "function", "function": {"name": "Grep", "arguments": "{}"}},
]


def test_an_answer_with_reasoning_text_and_tool_calls() -> None:
    request = _request(tools=[READ, GREP], context_management={"edits": []})
    doc = translation.message(
        _completion({"reasoning_content": "let me look", "content": "Looking.", "tool_calls": CALLS}, "tool_calls"),
        request,
    )
    thinking, text, *uses = doc["content"]
    assert thinking == {
        "type": "thinking",
        "thinking": "let me look",
        "signature": translation.signature("let me look"),
    }
    assert text == {"type": "text", "text": "Looking."}
    assert uses == [
        {"type": "tool_use", "id": "toolu_call_abc", "name": "Read", "input": {"file_path": "a.txt"}},
        {"type": "tool_use", "id": "toolu_kept", "name": "Grep", "input": {}},
        {"type": "tool_use", "id": "toolu_x_y_z", "name": "Grep", "input": {}},
    ]
    assert doc["stop_reason"] == "tool_use" and doc["context_management"] == {"applied_edits": []}
    parsed = anthropic.types.Message.model_validate(doc)  # the SDK's own type reads it
    assert [b.type for b in parsed.content] == ["thinking", "text", "tool_use", "tool_use", "tool_use"]
    beta = anthropic.types.beta.BetaMessage.model_validate(doc)
    assert beta.context_management is not None and beta.context_management.applied_edits == []
    # a backend that says "stop" after tool calls still ends the turn for the tools
    stopped = translation.message(_completion({"content": None, "tool_calls": CALLS[:1]}, "stop"), request)
    assert stopped["stop_reason"] == "tool_use" and [b["type"] for b in stopped["content"]] == ["tool_use"]


@pytest.mark.parametrize("arguments", ["{not json", "[1, 2]", '"text"'])
def test_tool_arguments_that_are_not_an_object_are_unreadable(arguments: str) -> None:
    call = {"id": "c", "type": "function", "function": {"name": "Read", "arguments": arguments}}
    with pytest.raises(WerkError):
        translation.message(_completion({"content": None, "tool_calls": [call]}, "tool_calls"), _request())


def _sse(*docs: object) -> bytes:
    return ("".join(f"data: {json.dumps(d)}\n\n" for d in docs) + "data: [DONE]\n\n").encode()


def _delta(finish: str | None = None, **delta: Any) -> JsonObject:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def _events(wire: bytes) -> list[tuple[str, JsonObject]]:
    out = []
    for block in wire.decode().strip().split("\n\n"):
        name, data = block.split("\n")
        out.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


def _call_piece(index: int, arguments: str, **first: str) -> JsonObject:
    function: JsonObject = {"arguments": arguments}
    if "name" in first:
        function["name"] = first["name"]
    piece: JsonObject = {"index": index, "function": function}
    if "id" in first:
        piece.update(id=first["id"], type="function")
    return piece


def test_a_streamed_answer_with_thinking_text_and_tool_calls() -> None:
    wire = _sse(
        _delta(role="assistant", content=None),
        _delta(reasoning_content="let me "),
        _delta(reasoning_content="look"),
        _delta(content="Looking."),
        _delta(tool_calls=[_call_piece(0, "", id="call_1", name="Read")]),
        _delta(tool_calls=[_call_piece(0, '{"file_')]),
        _delta(tool_calls=[_call_piece(0, 'path": "a.txt"}')]),
        _delta(tool_calls=[_call_piece(1, "{}", id="call_2", name="Grep")]),
        _delta("tool_calls"),
        {"choices": [], "usage": {"prompt_tokens": 30, "completion_tokens": 9}},
    )
    request = _request(tools=[READ, GREP], stream=True)
    events = _events(b"".join(translation.message_stream(sse_events([wire]), request)))
    assert [(n, d.get("index"), (d.get("delta") or d.get("content_block") or {}).get("type")) for n, d in events] == [
        ("message_start", None, None),
        ("content_block_start", 0, "thinking"),
        ("content_block_delta", 0, "thinking_delta"),
        ("content_block_delta", 0, "thinking_delta"),
        ("content_block_delta", 0, "signature_delta"),
        ("content_block_stop", 0, None),
        ("content_block_start", 1, "text"),
        ("content_block_delta", 1, "text_delta"),
        ("content_block_stop", 1, None),
        ("content_block_start", 2, "tool_use"),
        ("content_block_delta", 2, "input_json_delta"),
        ("content_block_delta", 2, "input_json_delta"),
        ("content_block_stop", 2, None),
        ("content_block_start", 3, "tool_use"),
        ("content_block_delta", 3, "input_json_delta"),
        ("content_block_stop", 3, None),
        ("message_delta", None, None),
        ("message_stop", None, None),
    ]
    assert events[9][1]["content_block"] == {"type": "tool_use", "id": "toolu_call_1", "name": "Read", "input": {}}
    assert events[4][1]["delta"]["signature"] == translation.signature("let me look")
    partial = "".join(
        d["delta"]["partial_json"] for n, d in events if d.get("index") == 2 and n == "content_block_delta"
    )
    assert json.loads(partial) == {"file_path": "a.txt"}
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"
    assert events[-2][1]["usage"] == {"input_tokens": 30, "output_tokens": 9}


def test_the_sdk_accumulates_the_translated_stream() -> None:
    """The SDK's own stream accumulator turns the events into the message a client sees."""
    wire = _sse(
        _delta(reasoning_content="hmm"),
        _delta(tool_calls=[_call_piece(0, '{"q": ', id="call_9", name="Grep")]),
        _delta(tool_calls=[_call_piece(0, '"werk"}')]),
        _delta("tool_calls"),
        {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3}},
    )
    snapshot: Any = None
    events = TypeAdapter(anthropic.types.RawMessageStreamEvent)
    bufs: dict[int, bytes] = {}
    for name, data in _events(b"".join(translation.message_stream(sse_events([wire]), _request(tools=[GREP])))):
        assert data["type"] == name
        snapshot = accumulate_event(event=events.validate_python(data), current_snapshot=snapshot, json_bufs=bufs)
    assert snapshot is not None and snapshot.stop_reason == "tool_use"
    thinking, use = snapshot.content
    assert thinking.type == "thinking" and thinking.thinking == "hmm" and thinking.signature
    assert use.type == "tool_use" and use.id == "toolu_call_9" and use.input == {"q": "werk"}


def test_interleaved_tool_call_pieces_end_the_stream_with_an_error() -> None:
    wire = _sse(
        _delta(tool_calls=[_call_piece(0, "{", id="a", name="Read")]),
        _delta(tool_calls=[_call_piece(1, "{}", id="b", name="Grep")]),
        _delta(tool_calls=[_call_piece(0, "}")]),
        _delta("tool_calls"),
    )
    events = _events(b"".join(translation.message_stream(sse_events([wire]), _request())))
    assert events[-1][0] == "error" and events[-1][1]["error"]["message"] == translation.STREAM_FAILED

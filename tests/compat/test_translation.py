"""The pure translations: OpenAI wire reading, Anthropic and Ollama requests and answers."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import ValidationError

from werk_host.compat import anthropic, calls, ollama
from werk_host.compat.upstream import UNREADABLE, read_document, sse_events
from werk_host.errors import WerkError
from werk_host.seam import InferenceResponse, JsonObject


def _sse(*docs: object, done: bool = True) -> bytes:
    text = "".join(f"data: {json.dumps(d)}\n\n" for d in docs)
    return (text + ("data: [DONE]\n\n" if done else "")).encode()


def _chunk(content: str | None = None, finish: str | None = None, **delta: Any) -> JsonObject:
    if content is not None:
        delta["content"] = content
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


USAGE: JsonObject = {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}}


# -- reading the OpenAI wire ---------------------------------------------------------------------


def test_sse_events_survive_any_chunking_and_crlf() -> None:
    wire = _sse(_chunk("a"), _chunk("b", "stop"), USAGE).replace(b"\n", b"\r\n") + b"data: {}\n\n"
    whole = list(sse_events([wire]))
    for size in (1, 2, 3, 7):
        pieces = [wire[i : i + size] for i in range(0, len(wire), size)]
        assert list(sse_events(pieces)) == whole
    assert [e.get("usage") for e in whole] == [None, None, USAGE["usage"]]  # nothing after [DONE]


def test_sse_error_lines_comments_and_bad_data() -> None:
    wire = b': keep-alive\n\nerror: {"code": 500, "message": "/srv/x.gguf exploded"}\n\n'
    assert list(sse_events([wire])) == [{"error": {"code": 500, "message": "/srv/x.gguf exploded"}}]
    with pytest.raises(WerkError) as err:
        list(sse_events([b"data: not json\n\n"]))
    assert err.value.message == UNREADABLE
    with pytest.raises(WerkError):
        list(sse_events([b"data: [1, 2]\n\n"]))


def test_read_document_refuses_non_objects() -> None:
    assert read_document([b'{"a"', b": 1}"]) == {"a": 1}
    for raw in (b"[]", b"<html>", b""):
        with pytest.raises(WerkError) as err:
            read_document([raw])
        assert err.value.message == UNREADABLE


def test_a_translated_stream_closes_its_upstream_when_the_client_leaves() -> None:
    closed: list[str] = []

    def body() -> Iterator[bytes]:
        try:
            yield from (b"one", b"two", b"three")
        finally:
            closed.append("body")

    response = InferenceResponse(200, {}, body(), lambda: closed.append("upstream"))
    stream = calls.streamed(response, iter(response.body))
    assert next(stream) == b"one"
    stream.close()  # what waitress does when the client has gone
    assert closed == ["body", "upstream"]  # the body first (its accounting), then the upstream


# -- Anthropic -----------------------------------------------------------------------------------


def _messages(**extra: Any) -> anthropic.MessagesRequest:
    body: dict[str, Any] = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], **extra}
    return anthropic.MessagesRequest.model_validate(body)


def test_anthropic_request_becomes_the_openai_chat_body() -> None:
    request = _messages(
        system=[{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": "c"},
            {"role": "user", "content": "d"},
        ],
        stop_sequences=["END"],
        temperature=0,
        top_p=0.5,
        top_k=3,
        stream=True,
        metadata={"user_id": "u1"},
    )
    assert anthropic.chat_body(request) == {
        "model": "m",
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": "be brief"}]},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": "c"},
            {"role": "user", "content": "d"},
        ],
        "max_tokens": 5,
        "stop": ["END"],
        "temperature": 0.0,
        "top_p": 0.5,
        "top_k": 3,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    counted = anthropic.count_request(request)
    assert counted.model_dump(exclude_none=True)["messages"] == anthropic.chat_body(request)["messages"]
    assert "stream" not in anthropic.chat_body(_messages(system=""))
    assert anthropic.chat_body(_messages(system=""))["messages"] == [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "source"),
        ({"system": [{"type": "document"}]}, "system: 'document' blocks are not supported"),
        ({"tools": [{"name": "t", "input_schema": {}}]}, "input_schema"),
        ({"thinking": {"type": "enabled", "budget_tokens": 1023}}, "budget_tokens"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": 1.5}, "temperature"),
        ({"stream": "yes"}, "stream"),
        ({"stop_sequences": [""]}, "stop_sequences"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "role"),
        ({"messages": []}, "messages"),
        ({"mcp_servers": [{"type": "url", "url": "https://mcp.example", "name": "x"}]}, "mcp_servers"),
    ],
)
def test_anthropic_requests_it_cannot_honour_are_refused(extra: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValidationError) as err:
        _messages(**extra)
    assert fragment in str(err.value)


def test_anthropic_accepts_what_has_no_effect() -> None:
    request = _messages(tools=[], tool_choice={"type": "auto"}, thinking={"type": "disabled"}, service_tier="auto")
    assert set(anthropic.chat_body(request)) == {"model", "messages", "max_tokens"}


def _completion(content: str, finish: str, **choice: Any) -> JsonObject:
    message = {"role": "assistant", "content": content}
    return {
        "choices": [{"index": 0, "message": message, "finish_reason": finish, **choice}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 4},
    }


def test_anthropic_message_from_a_completion() -> None:
    request = _messages(stop_sequences=["END"])
    doc = anthropic.message(_completion("hello", "length"), request)
    assert doc["id"].startswith("msg_") and doc["type"] == "message" and doc["model"] == "m"
    assert doc["content"] == [{"type": "text", "text": "hello"}]
    assert (doc["stop_reason"], doc["stop_sequence"]) == ("max_tokens", None)
    assert doc["usage"] == {"input_tokens": 11, "output_tokens": 4}
    # vLLM names the stop string that ended the answer; llama-server does not
    vllm = anthropic.message(_completion("x", "stop", stop_reason="END"), request)
    assert (vllm["stop_reason"], vllm["stop_sequence"]) == ("stop_sequence", "END")
    plain = anthropic.message(_completion("", "stop"), request)
    assert (plain["stop_reason"], plain["stop_sequence"], plain["content"]) == ("end_turn", None, [])
    with pytest.raises(WerkError):
        anthropic.message({"choices": []}, request)


def _events(wire: bytes) -> list[tuple[str, JsonObject]]:
    out = []
    for block in wire.decode().strip().split("\n\n"):
        name, data = block.split("\n")
        out.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


def _anthropic_stream(*docs: JsonObject, done: bool = True) -> list[tuple[str, JsonObject]]:
    stream = anthropic.message_stream(sse_events([_sse(*docs, done=done)]), _messages())
    return _events(b"".join(stream))


def test_anthropic_event_sequence() -> None:
    events = _anthropic_stream(_chunk("", role="assistant"), _chunk("Hel"), _chunk("lo"), _chunk(None, "length"), USAGE)
    assert [name for name, _ in events] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert all(data["type"] == name for name, data in events)
    start = events[0][1]["message"]
    assert (
        start["content"] == []
        and start["stop_reason"] is None
        and start["usage"] == {"input_tokens": 0, "output_tokens": 0}
    )
    assert [d["delta"]["text"] for n, d in events if n == "content_block_delta"] == ["Hel", "lo"]
    delta = events[5][1]
    assert delta["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert delta["usage"] == {"input_tokens": 7, "output_tokens": 2}


def test_anthropic_stream_without_text_has_no_block() -> None:
    names = [name for name, _ in _anthropic_stream(_chunk(None, "stop"), USAGE)]
    assert names == ["message_start", "message_delta", "message_stop"]


@pytest.mark.parametrize(
    ("wire", "message"),
    [
        (_sse(_chunk("a"), {"error": {"message": "/srv/model.gguf: out of memory"}}), anthropic.STREAM_FAILED),
        (_sse(_chunk("a"), done=False), anthropic.STREAM_CUT),
        (_sse(_chunk("a"), done=False) + b"data: {broken\n\n", anthropic.STREAM_FAILED),
    ],
)
def test_anthropic_stream_failures_end_with_an_error_event(wire: bytes, message: str) -> None:
    events = _events(b"".join(anthropic.message_stream(sse_events([wire]), _messages())))
    name, data = events[-1]
    assert name == "error" and data == {"type": "error", "error": {"type": "api_error", "message": message}}
    assert "gguf" not in json.dumps(events)


def test_anthropic_stream_when_the_backend_connection_breaks() -> None:
    def broken() -> Iterator[bytes]:
        yield _sse(_chunk("a"), done=False)
        raise ConnectionResetError("peer reset")

    events = _events(b"".join(anthropic.message_stream(sse_events(broken()), _messages())))
    assert [n for n, _ in events][-1] == "error"


def test_anthropic_error_types_by_status() -> None:
    kinds = {s: anthropic.error_type(s) for s in (400, 401, 403, 404, 409, 413, 429, 500, 501, 502, 503)}
    assert kinds == {
        400: "invalid_request_error",
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        409: "invalid_request_error",
        413: "request_too_large",
        429: "rate_limit_error",
        500: "api_error",
        501: "api_error",
        502: "api_error",
        503: "overloaded_error",
    }


# -- Ollama --------------------------------------------------------------------------------------


def _chat(**extra: Any) -> ollama.OllamaChatRequest:
    body: dict[str, Any] = {"model": "m:latest", "messages": [{"role": "user", "content": "hi"}], **extra}
    return ollama.OllamaChatRequest.model_validate(body)


def test_ollama_chat_becomes_the_openai_chat_body() -> None:
    options = {
        "num_predict": 9,
        "temperature": 0.2,
        "top_p": 0.9,
        "top_k": 4,
        "seed": 42,
        "stop": ["\n\n"],
        "num_ctx": 512,
        "num_thread": 8,
        "use_mmap": True,
    }
    body = ollama.chat_body(_chat(options=options, format="json", think="low"))
    assert body == {
        "model": "m:latest",  # as sent: the deployments resolve the tag (docs/compat.md, "Ollama")
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 9,
        "temperature": 0.2,
        "top_p": 0.9,
        "top_k": 4,
        "seed": 42,
        "stop": ["\n\n"],
        "response_format": {"type": "json_object"},
        "werk": {"reasoning": {"tier": "low"}},
        "messages": [{"role": "user", "content": "hi"}],
    }
    quiet = ollama.chat_body(_chat(stream=False, options={"num_predict": -1}, think=False))
    assert quiet == {"model": "m:latest", "stream": False, "messages": [{"role": "user", "content": "hi"}]}
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert ollama.chat_body(_chat(format=schema, think=True))["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "response", "schema": schema},
    }
    assert ollama.chat_body(_chat(think=True))["werk"] == {"reasoning": {"tier": "default"}}


def test_ollama_generate_bodies() -> None:
    chat, body = ollama.generate_body(ollama.OllamaGenerateRequest(model="m", prompt="p", system="s", stream=False))
    assert chat and body["messages"] == [{"role": "system", "content": "s"}, {"role": "user", "content": "p"}]
    chat, body = ollama.generate_body(ollama.OllamaGenerateRequest(model="m", prompt="p", raw=True, stream=False))
    assert not chat and body == {"model": "m", "stream": False, "prompt": "p"}


@pytest.mark.parametrize(
    ("model", "extra", "fragment"),
    [
        (ollama.OllamaChatRequest, {"tools": [{"type": "function"}]}, "function"),
        (ollama.OllamaChatRequest, {"messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}, "PNG, JPEG"),
        (ollama.OllamaChatRequest, {"messages": [{"role": "robot", "content": "x"}]}, "role"),
        (ollama.OllamaChatRequest, {"options": {"num_predict": 0}}, "num_predict"),
        (ollama.OllamaChatRequest, {"options": {"num_predict": -3}}, "num_predict"),
        (ollama.OllamaChatRequest, {"options": {"num_ctx": 0}}, "num_ctx"),
        (ollama.OllamaChatRequest, {"options": {"temperature": "1"}}, "temperature"),
        (ollama.OllamaChatRequest, {"options": {"top_p": 2}}, "top_p"),
        (ollama.OllamaChatRequest, {"format": "yaml"}, "format"),
        (ollama.OllamaChatRequest, {"think": "extreme"}, "think"),
        (ollama.OllamaChatRequest, {"keep_alive": "5 minutes"}, "keep_alive"),
        (ollama.OllamaChatRequest, {"keep_alive": "5d"}, "keep_alive"),
        (ollama.OllamaChatRequest, {"stream": 1}, "stream"),
        (ollama.OllamaGenerateRequest, {"suffix": "}"}, "suffix"),
        (ollama.OllamaGenerateRequest, {"template": "{{ .Prompt }}"}, "template"),
        (ollama.OllamaGenerateRequest, {"context": [1, 2]}, "context"),
        (ollama.OllamaGenerateRequest, {"raw": True, "system": "s"}, "raw cannot be combined"),
        (ollama.OllamaGenerateRequest, {"raw": True, "think": True}, "raw cannot be combined"),
    ],
)
def test_ollama_requests_it_cannot_honour_are_refused(model: Any, extra: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValidationError) as err:
        model.model_validate({"model": "m", **extra})
    assert fragment in str(err.value)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (0, 0.0),
        ("0", 0.0),
        (300, 300.0),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("1.5s", 1.5),
        ("250ms", 0.25),
        (-1, float("inf")),
        ("-1m", float("inf")),
    ],
)
def test_ollama_keep_alive(value: str | float, seconds: float) -> None:
    assert _chat(keep_alive=value).keep_alive == seconds
    assert _chat(keep_alive=value).keep_alive_s == seconds


def _lines(wire: bytes) -> list[JsonObject]:
    return [json.loads(line) for line in wire.decode().splitlines()]


def test_ollama_answers_from_openai_documents_and_streams() -> None:
    doc = {
        "choices": [{"index": 0, "message": {"content": "ok", "reasoning_content": "hmm"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1},
    }
    chat = ollama.answer(doc, ollama.Shape.CHAT, "m:latest", 0)
    assert chat["message"] == {"role": "assistant", "content": "ok", "thinking": "hmm"}
    assert (chat["model"], chat["done"], chat["done_reason"]) == ("m:latest", True, "stop")
    assert (chat["prompt_eval_count"], chat["eval_count"]) == (3, 1) and chat["total_duration"] > 0
    assert chat["created_at"].endswith("Z")
    text = {"choices": [{"index": 0, "text": "raw", "finish_reason": "length"}]}
    generated = ollama.answer(text, ollama.Shape.GENERATE, "m", 0)
    assert (generated["response"], generated["done_reason"]) == ("raw", "length")
    assert "eval_count" not in generated  # no usage reported: left out, not guessed

    wire = _sse(
        _chunk("", role="assistant"), _chunk(None, reasoning_content="t"), _chunk("A"), _chunk("B", "stop"), USAGE
    )
    lines = _lines(b"".join(ollama.answer_stream(sse_events([wire]), ollama.Shape.CHAT, "m", 0)))
    assert [(x["message"].get("content"), x["message"].get("thinking"), x["done"]) for x in lines] == [
        ("", "t", False),
        ("A", None, False),
        ("B", None, False),
        ("", None, True),
    ]
    assert (lines[-1]["prompt_eval_count"], lines[-1]["eval_count"], lines[-1]["done_reason"]) == (7, 2, "stop")
    cut = _lines(
        b"".join(ollama.answer_stream(sse_events([_sse(_chunk("A"), done=False)]), ollama.Shape.GENERATE, "m", 0))
    )
    assert cut == [
        {"model": "m", "created_at": cut[0]["created_at"], "response": "A", "done": False},
        {"error": ollama.STREAM_CUT},
    ]

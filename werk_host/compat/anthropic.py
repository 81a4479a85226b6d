"""The Anthropic Messages API as a translation of the ``/v1`` chat path (docs/compat.md).

Requests (``POST /v1/messages``, ``POST /v1/messages/count_tokens``) are validated by the
models below and become the OpenAI chat body of :func:`chat_body` (or the
:class:`~werk_host.protocol.ChatRequest` of :func:`count_request`): ``system`` becomes a
leading system message, text content blocks become OpenAI text parts, ``max_tokens``,
``stop_sequences`` (``stop``), ``temperature``, ``top_p`` and ``top_k`` carry over. What the
translation cannot honour is refused, never dropped: content blocks other than text, tools,
and thinking other than ``{"type": "disabled"}``.

Answers: the OpenAI ``chat.completion`` becomes a ``message`` (:func:`message`); the OpenAI
stream becomes Anthropic's event sequence (:func:`message_stream`): ``message_start``, one text
block (``content_block_start``, ``content_block_delta`` …, ``content_block_stop``) when the
answer has text, ``message_delta`` with ``stop_reason`` and the usage, ``message_stop``. The
backend reports usage at the end of a stream, so ``message_start`` carries zero counts and
``message_delta`` the exact ``input_tokens`` and ``output_tokens`` (cumulative, as Anthropic
defines them; the SDKs take both from it).
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Iterable, Iterator, Sequence
from typing import Annotated, Any, Final, Literal

from pydantic import Field, JsonValue, model_validator

from werk_host.compat.upstream import STREAM_CUT, STREAM_FAILED, Usage, as_object, first_choice, text_of, unreadable
from werk_host.protocol import ChatRequest, StrictModel
from werk_host.protocol.base import JsonBool, JsonFloat, NonNegativeJsonInt, PositiveJsonInt
from werk_host.seam import JsonObject

log = logging.getLogger(__name__)

#: OpenAI ``finish_reason`` → Anthropic ``stop_reason``.
STOP_REASONS: Final[dict[str, str]] = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}
#: HTTP status → Anthropic error ``type`` (others: ``invalid_request_error`` below 500, else ``api_error``).
ERROR_TYPES: Final[dict[int, str]] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def _text_blocks(value: object, where: str) -> None:
    """Refuse content blocks that are not text with a message that names the rule."""
    if isinstance(value, list) and any(isinstance(b, dict) and b.get("type") != "text" for b in value):
        raise ValueError(f"{where}: only text content blocks are supported")


class TextBlock(StrictModel):
    """A text content block. ``cache_control`` is accepted and has no effect (prompt prefixes
    are reused automatically where the backend can); ``citations`` is accepted on replayed turns."""

    type: Literal["text"]
    text: str
    cache_control: dict[str, JsonValue] | None = None
    citations: list[dict[str, JsonValue]] | None = None


class InputMessage(StrictModel):
    role: Literal["user", "assistant"]
    content: str | Annotated[list[TextBlock], Field(min_length=1)]

    @model_validator(mode="before")
    @classmethod
    def _text_only(cls, data: Any) -> Any:
        if isinstance(data, dict):
            _text_blocks(data.get("content"), "content")
        return data


class Thinking(StrictModel):
    """Extended thinking: only ``{"type": "disabled"}`` (no thinking blocks are produced)."""

    type: Literal["disabled"]


class Metadata(StrictModel):
    """Accepted and not used."""

    user_id: str | None = Field(None, max_length=256)


class ToolChoice(StrictModel):
    """Without tools only ``auto`` and ``none`` mean anything; both are accepted."""

    type: Literal["auto", "none"]


class CountTokensRequest(StrictModel):
    """``POST /v1/messages/count_tokens``: the conversation whose input is counted."""

    model: str = Field(min_length=1, max_length=256)
    messages: list[InputMessage] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[dict[str, JsonValue]] | None = None  # only empty: see _supported
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    #: automatic prompt caching: accepted, no effect (see TextBlock)
    cache_control: dict[str, JsonValue] | None = None

    @model_validator(mode="before")
    @classmethod
    def _supported(cls, data: Any) -> Any:
        if isinstance(data, dict):
            _text_blocks(data.get("system"), "system")
            if data.get("tools"):
                raise ValueError("tools are not supported on this route (use /v1/chat/completions)")
            thinking = data.get("thinking")
            if isinstance(thinking, dict) and thinking.get("type") != "disabled":
                raise ValueError('thinking: only {"type": "disabled"} is supported')
        return data


class MessagesRequest(CountTokensRequest):
    """``POST /v1/messages``."""

    max_tokens: PositiveJsonInt
    stop_sequences: list[Annotated[str, Field(min_length=1)]] | None = None
    temperature: Annotated[JsonFloat, Field(ge=0, le=1)] | None = None
    top_p: Annotated[JsonFloat, Field(ge=0, le=1)] | None = None
    top_k: NonNegativeJsonInt | None = None
    stream: JsonBool | None = None
    metadata: Metadata | None = None
    service_tier: Literal["auto", "standard_only"] | None = None


# -- requests ----------------------------------------------------------------------------------


def _content(content: str | list[TextBlock]) -> JsonValue:
    if isinstance(content, str):
        return content
    return [{"type": "text", "text": block.text} for block in content]


def openai_messages(request: CountTokensRequest) -> list[JsonValue]:
    """The OpenAI messages of a conversation: a non-empty ``system`` first, then each turn."""
    messages: list[JsonValue] = []
    if request.system:
        messages.append({"role": "system", "content": _content(request.system)})
    messages.extend({"role": m.role, "content": _content(m.content)} for m in request.messages)
    return messages


def count_request(request: CountTokensRequest) -> ChatRequest:
    """The chat request whose input ``werk_count_tokens`` counts: exactly what
    :func:`chat_body` sends, so the count equals the answer's ``usage.input_tokens``."""
    return ChatRequest.model_validate({"model": request.model, "messages": openai_messages(request)})


def chat_body(request: MessagesRequest) -> JsonObject:
    """The OpenAI chat body for ``request`` (a stream asks for its usage at the end)."""
    body: JsonObject = {"model": request.model, "messages": openai_messages(request), "max_tokens": request.max_tokens}
    if request.stop_sequences:
        body["stop"] = list(request.stop_sequences)
    for name, value in (("temperature", request.temperature), ("top_p", request.top_p), ("top_k", request.top_k)):
        if value is not None:
            body[name] = value
    if request.stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


# -- answers -----------------------------------------------------------------------------------


def new_message_id() -> str:
    return "msg_" + secrets.token_hex(12)


def stop_of(choice: JsonObject, stop_sequences: Sequence[str]) -> tuple[str, str | None]:
    """``(stop_reason, stop_sequence)`` of a finished choice. The matched stop sequence is named
    only when the backend reports it (vLLM's ``stop_reason``); otherwise a stop is ``end_turn``."""
    finish = choice.get("finish_reason")
    matched = choice.get("stop_reason")
    if finish == "stop" and isinstance(matched, str) and matched in stop_sequences:
        return "stop_sequence", matched
    return STOP_REASONS.get(finish, "end_turn") if isinstance(finish, str) else "end_turn", None


def usage_document(usage: Usage | None) -> JsonObject:
    """Anthropic usage; a backend that reports none gives zero counts (docs/compat.md)."""
    return {
        "input_tokens": usage.prompt_tokens if usage else 0,
        "output_tokens": usage.completion_tokens if usage else 0,
    }


def message(doc: JsonObject, request: MessagesRequest) -> JsonObject:
    """The Anthropic ``message`` for an OpenAI ``chat.completion`` document."""
    choice = first_choice(doc)
    if choice is None:
        raise unreadable()
    text = text_of((as_object(choice.get("message")) or {}).get("content"))
    stop_reason, stop_sequence = stop_of(choice, request.stop_sequences or ())
    return {
        "id": new_message_id(),
        "type": "message",
        "role": "assistant",
        "model": request.model,
        "content": [{"type": "text", "text": text}] if text else [],
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": usage_document(Usage.of(doc)),
    }


def sse(name: str, data: JsonObject) -> bytes:
    """One Anthropic server-sent event."""
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def error_event(message_text: str) -> bytes:
    return sse("error", {"type": "error", "error": {"type": "api_error", "message": message_text}})


def message_stream(events: Iterable[JsonObject], request: MessagesRequest) -> Iterator[bytes]:
    """Anthropic's event sequence for the OpenAI chunks ``events`` (see the module docstring).

    A backend failure inside the stream (an error event, unreadable data, a broken connection,
    or an end without a finish reason) ends it with an ``error`` event carrying a fixed message."""
    start: JsonObject = {
        "id": new_message_id(),
        "type": "message",
        "role": "assistant",
        "model": request.model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage_document(None),
    }
    yield sse("message_start", {"type": "message_start", "message": start})
    block_open = False
    finished: JsonObject | None = None
    usage: Usage | None = None
    try:
        for event in events:
            if "error" in event:
                log.warning("the backend reported an error inside a stream")
                yield error_event(STREAM_FAILED)
                return
            usage = Usage.of(event) or usage
            choice = first_choice(event)
            if choice is None:
                continue
            text = text_of((as_object(choice.get("delta")) or {}).get("content"))
            if text:
                if not block_open:
                    block_open = True
                    block: JsonObject = {"type": "text", "text": ""}
                    yield sse(
                        "content_block_start", {"type": "content_block_start", "index": 0, "content_block": block}
                    )
                delta: JsonObject = {"type": "text_delta", "text": text}
                yield sse("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta})
            if isinstance(choice.get("finish_reason"), str):
                finished = choice
    except Exception as err:  # one line, no traceback (docs/operations.md, "Backend failures")
        log.warning("a backend stream failed while it was translated: %s", type(err).__name__)
        yield error_event(STREAM_FAILED)
        return
    if finished is None:
        yield error_event(STREAM_CUT)
        return
    if block_open:
        yield sse("content_block_stop", {"type": "content_block_stop", "index": 0})
    stop_reason, stop_sequence = stop_of(finished, request.stop_sequences or ())
    yield sse(
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
            "usage": usage_document(usage),
        },
    )
    yield sse("message_stop", {"type": "message_stop"})


# -- errors ------------------------------------------------------------------------------------


def error_type(status: int) -> str:
    return ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


def error_document(status: int, message_text: str, request_id: str) -> JsonObject:
    """Anthropic's error body: ``{"type": "error", "error": {"type", "message"}, "request_id"}``."""
    return {"type": "error", "error": {"type": error_type(status), "message": message_text}, "request_id": request_id}

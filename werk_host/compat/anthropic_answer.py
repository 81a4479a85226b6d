"""An OpenAI chat answer as an Anthropic ``message`` or Anthropic's event stream.

Content blocks, in this order: ``thinking`` (the backend's reasoning text, OpenAI
``reasoning_content``), ``text``, then one ``tool_use`` block per OpenAI tool call. A thinking
block carries a ``signature`` clients accept and send back; Werk never checks it, since thinking
sent back is dropped from the prompt (werk_host/compat/anthropic_request.py). A tool call's id
becomes a ``toolu_`` id (:func:`tool_use_id`), the same for the same OpenAI id, so the
``tool_result`` that answers it names the id the backend's call had.

The stream (:func:`message_stream`): ``message_start`` (zero usage: the backend reports usage at
the end), then each block as ``content_block_start``, its deltas (``thinking_delta`` then one
``signature_delta``; ``text_delta``; ``input_json_delta`` with the arguments' ``partial_json``)
and ``content_block_stop``, blocks numbered from 0 in the order they open, then
``message_delta`` with ``stop_reason`` and the exact cumulative usage, then ``message_stop``.
A tool call's arguments are streamed as the backend sends them; a piece for a call whose block
was already closed (calls interleaved) cannot be streamed and ends the stream with an error.
``stop_reason`` is ``tool_use`` when the backend finished with tool calls (``tool_calls``, or a
``stop`` after tool calls). A loading notice (werk_host/service/loading.py) is a thinking block
of its own, closed before the answer's first block; a :class:`LoadFailed` ends the stream with
an ``error`` event carrying its public message (``overloaded_error`` when retryable).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import secrets
from collections.abc import Iterable, Iterator, Sequence
from typing import Final

from pydantic import JsonValue

from werk_host.compat.anthropic_models import MessagesRequest
from werk_host.compat.upstream import (
    STREAM_CUT,
    STREAM_FAILED,
    Usage,
    as_object,
    first_choice,
    text_of,
    unreadable,
)
from werk_host.seam import JsonObject
from werk_host.service.loading import LoadFailed, is_notice

log = logging.getLogger(__name__)

#: OpenAI ``finish_reason`` → Anthropic ``stop_reason``.
STOP_REASONS: Final[dict[str, str]] = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}
_ID_UNSAFE = re.compile(r"[^a-zA-Z0-9_-]")


def new_message_id() -> str:
    return "msg_" + secrets.token_hex(12)


def tool_use_id(openai_id: JsonValue | None) -> str:
    """The ``toolu_`` id of an OpenAI tool call id: kept when it is one already, else prefixed
    (characters outside Anthropic's id rule become ``_``); a call without an id gets a new one."""
    if not isinstance(openai_id, str) or not openai_id:
        return "toolu_" + secrets.token_hex(12)
    safe = _ID_UNSAFE.sub("_", openai_id[:200])
    return safe if safe.startswith("toolu_") else "toolu_" + safe


def signature(thinking: str) -> str:
    """A thinking block's signature: opaque to clients, derived from the text (never checked)."""
    return "werk-" + hashlib.sha256(thinking.encode("utf-8", "surrogatepass")).hexdigest()


def stop_of(choice: JsonObject, stop_sequences: Sequence[str], called: bool = False) -> tuple[str, str | None]:
    """``(stop_reason, stop_sequence)`` of a finished choice. The matched stop sequence is named
    only when the backend reports it (vLLM's ``stop_reason``); otherwise a stop is ``end_turn``,
    or ``tool_use`` when the answer ``called`` tools."""
    finish = choice.get("finish_reason")
    matched = choice.get("stop_reason")
    if finish == "stop" and isinstance(matched, str) and matched in stop_sequences:
        return "stop_sequence", matched
    if finish == "stop" and called:
        return "tool_use", None
    return STOP_REASONS.get(finish, "end_turn") if isinstance(finish, str) else "end_turn", None


def usage_document(usage: Usage | None) -> JsonObject:
    """Anthropic usage; a backend that reports none gives zero counts (docs/compat.md). Where the
    backend reports a cache count, prompt tokens taken from its cache are
    ``cache_read_input_tokens``, not ``input_tokens`` (docs/prompt-cache.md)."""
    doc: JsonObject = {
        "input_tokens": usage.evaluated_tokens if usage else 0,
        "output_tokens": usage.completion_tokens if usage else 0,
    }
    if usage is not None and usage.cached_tokens is not None:
        doc["cache_creation_input_tokens"] = 0
        doc["cache_read_input_tokens"] = usage.cached_tokens
    return doc


def _context_management(request: MessagesRequest, doc: JsonObject) -> None:
    """Where context management was asked for, the truth: no edit was applied."""
    if request.context_management is not None:
        doc["context_management"] = {"applied_edits": []}


def _tool_input(arguments: JsonValue | None) -> JsonObject:
    """A tool call's ``input``: its arguments JSON, which must be an object (empty: ``{}``)."""
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        return {}
    if isinstance(arguments, dict):
        return arguments
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else None
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        raise unreadable()
    return parsed


def _tool_blocks(calls: JsonValue | None) -> list[JsonValue]:
    blocks: list[JsonValue] = []
    for call in calls if isinstance(calls, list) else ():
        found = as_object(call)
        function = as_object(found.get("function")) if found is not None else None
        name = function.get("name") if function is not None else None
        if found is None or function is None or not isinstance(name, str) or not name:
            raise unreadable()
        blocks.append(
            {
                "type": "tool_use",
                "id": tool_use_id(found.get("id")),
                "name": name,
                "input": _tool_input(function.get("arguments")),
            }
        )
    return blocks


def message(doc: JsonObject, request: MessagesRequest) -> JsonObject:
    """The Anthropic ``message`` for an OpenAI ``chat.completion`` document."""
    choice = first_choice(doc)
    if choice is None:
        raise unreadable()
    answer = as_object(choice.get("message")) or {}
    thinking = text_of(answer.get("reasoning_content"))
    text = text_of(answer.get("content"))
    content: list[JsonValue] = []
    if thinking:
        content.append({"type": "thinking", "thinking": thinking, "signature": signature(thinking)})
    if text:
        content.append({"type": "text", "text": text})
    tools = _tool_blocks(answer.get("tool_calls"))
    content.extend(tools)
    stop_reason, stop_sequence = stop_of(choice, request.stop_sequences or (), bool(tools))
    out: JsonObject = {
        "id": new_message_id(),
        "type": "message",
        "role": "assistant",
        "model": request.model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": usage_document(Usage.of(doc)),
    }
    _context_management(request, out)
    return out


def sse(name: str, data: JsonObject) -> bytes:
    """One Anthropic server-sent event."""
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def error_event(message_text: str, kind: str = "api_error") -> bytes:
    return sse("error", {"type": "error", "error": {"type": kind, "message": message_text}})


class _Blocks:
    """The content blocks of one streamed answer: which is open, and the events that open, fill
    and close them (see the module docstring)."""

    def __init__(self) -> None:
        self.index = -1
        self.open: str | None = None  # "thinking", "text" or "tool"
        self.thinking = ""
        self.tool: int | None = None  # the OpenAI index of the open tool call
        self.tools_done: set[int] = set()
        self.called = False

    def _start(self, kind: str, block: JsonObject) -> Iterator[bytes]:
        yield from self.close()
        self.index += 1
        self.open = kind
        yield sse("content_block_start", {"type": "content_block_start", "index": self.index, "content_block": block})

    def _delta(self, delta: JsonObject) -> bytes:
        return sse("content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta})

    def close(self) -> Iterator[bytes]:
        if self.open is None:
            return
        if self.open == "thinking":
            yield self._delta({"type": "signature_delta", "signature": signature(self.thinking)})
            self.thinking = ""
        if self.tool is not None:
            self.tools_done.add(self.tool)
            self.tool = None
        self.open = None
        yield sse("content_block_stop", {"type": "content_block_stop", "index": self.index})

    def thinking_text(self, text: str) -> Iterator[bytes]:
        if self.open != "thinking":
            yield from self._start("thinking", {"type": "thinking", "thinking": "", "signature": ""})
        self.thinking += text
        yield self._delta({"type": "thinking_delta", "thinking": text})

    def text(self, text: str) -> Iterator[bytes]:
        if self.open != "text":
            yield from self._start("text", {"type": "text", "text": ""})
        yield self._delta({"type": "text_delta", "text": text})

    def tool_call(self, piece: JsonObject) -> Iterator[bytes]:
        index = piece.get("index", 0)
        if not isinstance(index, int) or index in self.tools_done:
            raise unreadable()  # interleaved with another call: cannot be streamed in order
        function = as_object(piece.get("function")) or {}
        if self.open != "tool" or self.tool != index:
            name = function.get("name")
            if not isinstance(name, str) or not name:
                raise unreadable()
            block: JsonObject = {"type": "tool_use", "id": tool_use_id(piece.get("id")), "name": name, "input": {}}
            yield from self._start("tool", block)
            self.tool = index
            self.called = True
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            yield self._delta({"type": "input_json_delta", "partial_json": arguments})


def _start_event(request: MessagesRequest) -> bytes:
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
    return sse("message_start", {"type": "message_start", "message": start})


def message_stream(events: Iterable[JsonObject], request: MessagesRequest) -> Iterator[bytes]:
    """Anthropic's event sequence for the OpenAI chunks ``events`` (see the module docstring).

    A backend failure inside the stream (an error event, unreadable data, a broken connection,
    or an end without a finish reason) ends it with an ``error`` event carrying a fixed message."""
    yield _start_event(request)
    blocks = _Blocks()
    finished: JsonObject | None = None
    usage: Usage | None = None
    notice = False
    try:
        for event in events:
            if "error" in event:
                log.warning("the backend reported an error inside a stream")
                yield error_event(STREAM_FAILED)
                return
            if is_notice(event):  # a thinking block of its own (werk_host/service/loading.py)
                notice = True
            elif notice:
                notice = False
                yield from blocks.close()
            usage = Usage.of(event) or usage
            choice = first_choice(event)
            if choice is None:
                continue
            delta = as_object(choice.get("delta")) or {}
            thinking = text_of(delta.get("reasoning_content"))
            if thinking:
                yield from blocks.thinking_text(thinking)
            text = text_of(delta.get("content"))
            if text:
                yield from blocks.text(text)
            calls = delta.get("tool_calls")
            for piece in calls if isinstance(calls, list) else ():
                yield from blocks.tool_call(as_object(piece) or {})
            if isinstance(choice.get("finish_reason"), str):
                finished = choice
    except LoadFailed as err:  # the host's own public reason; a retryable one is an overload
        yield error_event(err.public_message(), "overloaded_error" if err.retryable else "api_error")
        return
    except Exception as err:  # one line, no traceback (docs/operations.md, "Backend failures")
        log.warning("a backend stream failed while it was translated: %s", type(err).__name__)
        yield error_event(STREAM_FAILED)
        return
    if finished is None:
        yield error_event(STREAM_CUT)
        return
    yield from blocks.close()
    stop_reason, stop_sequence = stop_of(finished, request.stop_sequences or (), blocks.called)
    delta_event: JsonObject = {
        "type": "message_delta",
        "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
        "usage": usage_document(usage),
    }
    _context_management(request, delta_event)
    yield sse("message_delta", delta_event)
    yield sse("message_stop", {"type": "message_stop"})

"""Ollama answers from the OpenAI answers of the ``/v1`` path (docs/compat.md, "Ollama").

NDJSON lines by default, one JSON object with ``stream: false``; the last (or only) object has
``done: true``, ``done_reason``, ``prompt_eval_count`` and ``eval_count`` (the backend's usage;
left out when it reports none) and ``total_duration`` (measured here, ns). A model's reasoning
text (``reasoning_content``) is ``thinking``.

Tool calls: OpenAI ``tool_calls`` become ``message.tool_calls`` entries ``{"id", "function":
{"index", "name", "arguments": {...}}}`` (the arguments as an object, as Ollama gives them; the
backend's call id, or ``call_`` and eight random characters). A stream carries them in one line
once the backend finished them (OpenAI sends the arguments in fragments), before the ``done``
line. ``finish_reason: "tool_calls"`` is ``done_reason: "stop"``, as Ollama answers a call.
Arguments that are not a JSON object are the backend's fault: ``unavailable`` (a stream ends
with an error line).

Errors are ``{"error": message}`` (:func:`error_document`), inside a stream too.
"""

from __future__ import annotations

import json
import logging
import secrets
import string
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Final, Literal

from pydantic import JsonValue

from werk_host.compat.upstream import STREAM_CUT, STREAM_FAILED, Usage, as_object, first_choice, text_of, unreadable
from werk_host.errors import ErrorCode, WerkError
from werk_host.seam import JsonObject
from werk_host.service.loading import LoadFailed

log = logging.getLogger(__name__)

#: What a tool call whose arguments are not a JSON object is answered with.
BAD_ARGUMENTS: Final = "the backend returned a tool call whose arguments are not a JSON object"
_ID_CHARS: Final = string.ascii_lowercase + string.digits


class Shape(StrEnum):
    """Which Ollama answer shape: ``message`` objects (chat) or ``response`` text (generate)."""

    CHAT = "chat"
    GENERATE = "generate"


def timestamp() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def call_id() -> str:
    """A fresh tool-call id in Ollama's form."""
    return "call_" + "".join(secrets.choice(_ID_CHARS) for _ in range(8))


def _piece(shape: Shape, model: str, text: str, thinking: str, calls: list[JsonValue] | None = None) -> JsonObject:
    doc: JsonObject = {"model": model, "created_at": timestamp()}
    if shape is Shape.CHAT:
        message: JsonObject = {"role": "assistant", "content": text}
        if thinking:
            message["thinking"] = thinking
        if calls:
            message["tool_calls"] = calls
        doc["message"] = message
    else:
        doc["response"] = text
        if thinking:
            doc["thinking"] = thinking
    doc["done"] = False
    return doc


def _reason(finish: str | None) -> str:
    return "stop" if finish in (None, "tool_calls", "function_call") else str(finish)


def _finished(doc: JsonObject, finish: str | None, usage: Usage | None, started_ns: int) -> JsonObject:
    doc["done"] = True
    doc["done_reason"] = _reason(finish)
    doc["total_duration"] = time.monotonic_ns() - started_ns
    if usage is not None:
        doc["prompt_eval_count"] = usage.evaluated_tokens  # Ollama's: cached prompt tokens are not evaluated
        doc["eval_count"] = usage.completion_tokens
    return doc


def _texts(choice: JsonObject, part: str) -> tuple[str, str]:
    """``(text, thinking)`` of a choice: chat ``message``/``delta`` content and reasoning, or
    completions ``text``."""
    inner = as_object(choice.get(part))
    if inner is None:
        return text_of(choice.get("text")), ""
    return text_of(inner.get("content")), text_of(inner.get("reasoning_content"))


def ollama_call(index: int, backend_id: str | None, name: str, arguments: str) -> JsonObject:
    """One Ollama tool call from an OpenAI one (raises ``unavailable`` for arguments that are
    not a JSON object; empty arguments are ``{}``)."""
    try:
        parsed = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        raise WerkError(ErrorCode.UNAVAILABLE, BAD_ARGUMENTS, retryable=True)
    return {"id": backend_id or call_id(), "function": {"index": index, "name": name, "arguments": parsed}}


def _calls(message: JsonObject) -> list[JsonValue]:
    calls = message.get("tool_calls")
    out: list[JsonValue] = []
    for index, entry in enumerate(calls if isinstance(calls, list) else []):
        call = as_object(entry)
        function = as_object(call.get("function")) if call is not None else None
        if call is None or function is None or not isinstance(function.get("name"), str):
            raise unreadable()
        backend_id = call.get("id")
        name = text_of(function.get("name"))
        out.append(
            ollama_call(
                index, backend_id if isinstance(backend_id, str) else None, name, text_of(function.get("arguments"))
            )
        )
    return out


def answer(doc: JsonObject, shape: Shape, model: str, started_ns: int) -> JsonObject:
    """The single Ollama object (``stream: false``) for an OpenAI answer document."""
    choice = first_choice(doc)
    if choice is None:
        raise unreadable()
    text, thinking = _texts(choice, "message")
    message = as_object(choice.get("message"))
    calls = _calls(message) if message is not None and shape is Shape.CHAT else None
    finish = choice.get("finish_reason")
    piece = _piece(shape, model, text, thinking, calls)
    return _finished(piece, finish if isinstance(finish, str) else None, Usage.of(doc), started_ns)


def line(doc: JsonObject) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode() + b"\n"


@dataclass
class _Call:
    """A streamed OpenAI tool call, put together from its deltas."""

    id: str | None = None
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class _Calls:
    """The tool calls of a stream, by OpenAI ``index``."""

    def __init__(self) -> None:
        self.by_index: dict[int, _Call] = {}

    def add(self, delta: JsonObject) -> None:
        entries = delta.get("tool_calls")
        for entry in entries if isinstance(entries, list) else []:
            part = as_object(entry)
            if part is None:
                continue
            index = part.get("index")
            call = self.by_index.setdefault(index if isinstance(index, int) else len(self.by_index), _Call())
            if isinstance(part.get("id"), str) and part["id"]:
                call.id = str(part["id"])
            function = as_object(part.get("function"))
            if function is not None:
                call.name += text_of(function.get("name"))
                call.arguments.append(text_of(function.get("arguments")))

    def ollama(self) -> list[JsonValue]:
        return [
            ollama_call(n, call.id, call.name, "".join(call.arguments))
            for n, (_, call) in enumerate(sorted(self.by_index.items()))
        ]


def answer_stream(events: Iterable[JsonObject], shape: Shape, model: str, started_ns: int) -> Iterator[bytes]:
    """NDJSON lines for the OpenAI chunks ``events``: one per text (or thinking) delta, one with
    the tool calls when the backend finished them, then the ``done`` line. A backend failure
    inside the stream ends it with an ``{"error": ...}`` line carrying a fixed message."""
    finish: str | None = None
    usage: Usage | None = None
    calls = _Calls()
    try:
        for event in events:
            if "error" in event:
                log.warning("the backend reported an error inside a stream")
                yield line(error_document(STREAM_FAILED))
                return
            usage = Usage.of(event) or usage
            choice = first_choice(event)
            if choice is None:
                continue
            text, thinking = _texts(choice, "delta")
            if text or thinking:
                yield line(_piece(shape, model, text, thinking))
            delta = as_object(choice.get("delta"))
            if delta is not None and shape is Shape.CHAT:
                calls.add(delta)
            reason = choice.get("finish_reason")
            if isinstance(reason, str):
                finish = reason
    except LoadFailed as err:  # the host's own public reason (werk_host/service/loading.py)
        yield line(error_document(err.public_message()))
        return
    except Exception as err:  # one line, no traceback (docs/operations.md, "Backend failures")
        log.warning("a backend stream failed while it was translated: %s", type(err).__name__)
        yield line(error_document(STREAM_FAILED))
        return
    if finish is None:
        yield line(error_document(STREAM_CUT))
        return
    if calls.by_index:
        try:
            called = _piece(shape, model, "", "", calls.ollama())
        except WerkError as err:
            log.warning("a backend tool call could not be translated")
            yield line(error_document(err.public_message()))
            return
        yield line(called)
    yield line(_finished(_piece(shape, model, "", ""), finish, usage, started_ns))


def residency_answer(shape: Shape, model: str, reason: Literal["load", "unload"]) -> JsonObject:
    """The answer to a load (or unload) request: ``done`` with ``done_reason`` saying which."""
    doc = _piece(shape, model, "", "")
    doc["done"] = True
    doc["done_reason"] = reason
    return doc


def error_document(message: str) -> JsonObject:
    return {"error": message}

"""OpenAI answers for backends that run their engine in process (docs/plugin-kit.md, "OpenAI
answers").

A ``werk_chat_completion`` / ``werk_text_completion`` hook returns an :class:`InferenceResponse`
whose body the host relays to the client as it is. A process backend relays its server's bytes;
an in-process engine writes them with this module. The contract:

* :class:`Usage` is one answer's token accounting. Its JSON is OpenAI's ``usage``:
  ``prompt_tokens``, ``completion_tokens``, ``total_tokens`` (their sum) and, only when the
  engine reports it, ``prompt_tokens_details.cached_tokens``.
* :class:`Reply` is one answer, ``kind`` ``"chat"`` (``chat.completion``, chunks
  ``chat.completion.chunk``) or ``"text"`` (``text_completion``, legacy completions). Every
  document and chunk it writes carries the same ``id`` (``chatcmpl-…`` / ``cmpl-…``),
  ``created`` and ``model``, and one choice at ``index`` 0 with ``logprobs: null``.

  - :meth:`Reply.answer`: the whole answer as one JSON document with ``usage``
    (``Content-Type: application/json`` and ``Content-Length``).
  - :meth:`Reply.chunk`: one server-sent event (``data: {json}\\n\\n``) with a piece of text;
    the first chat chunk's ``delta`` carries ``"role": "assistant"``.
  - :meth:`Reply.end`: the events that close a stream: the chunk with ``finish_reason``, which
    carries ``usage``; when the client asked for ``stream_options.include_usage``, the usage
    instead follows in its own chunk with ``choices: []`` (OpenAI's shape). Then
    ``data: [DONE]``. Either way the last event with a ``usage`` is the answer's usage, which
    is what the host reads for accounting.
  - :meth:`Reply.stream`: the events as a ``text/event-stream`` response; ``close`` is the
    backend's own (it must stop the engine's work for a client that went away).

* :func:`error_event` ends a stream that failed after its status was sent (the status cannot
  change any more): OpenAI's error object with ``type: server_error``, then ``data: [DONE]`` —
  the shape the host itself writes (:mod:`werk_host.http.openai`).
* :func:`error_answer` is an OpenAI error document with its HTTP status. Before an answer
  starts, raising :class:`~werk_host.plugin.WerkError` is usually better: the host renders it
  with the public message. The host replaces the message of a backend's error answer with its
  own redacted text (it may carry backend internals); the status and ``type`` pass through.

JSON is written with ``ensure_ascii=False`` (UTF-8), so text is sent as the engine produced it.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from pydantic import JsonValue

from werk_host.seam import InferenceResponse

__all__ = [
    "SSE_DONE",
    "Reply",
    "ReplyKind",
    "Usage",
    "error_answer",
    "error_event",
    "json_answer",
    "sse",
]

#: ``"chat"``: chat completions; ``"text"``: (legacy) text completions.
ReplyKind = Literal["chat", "text"]

#: The last event of every OpenAI stream.
SSE_DONE = b"data: [DONE]\n\n"

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


@dataclass(frozen=True)
class Usage:
    """The tokens of one answer (module docstring)."""

    prompt_tokens: int
    completion_tokens: int
    #: prompt tokens served from the engine's prefix cache (``None``: not reported)
    cached_tokens: int | None = None

    def to_json(self) -> dict[str, JsonValue]:
        doc: dict[str, JsonValue] = {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }
        if self.cached_tokens is not None:
            doc["prompt_tokens_details"] = {"cached_tokens": self.cached_tokens}
        return doc


def sse(doc: Mapping[str, JsonValue]) -> bytes:
    """One server-sent event carrying ``doc``."""
    return f"data: {json.dumps(doc, ensure_ascii=False)}\n\n".encode()


def _nothing() -> None:
    return None


def json_answer(doc: Mapping[str, JsonValue], status: int = 200) -> InferenceResponse:
    """``doc`` as a whole JSON response with its ``Content-Length``."""
    body = json.dumps(doc, ensure_ascii=False).encode()
    headers = {"Content-Type": "application/json", "Content-Length": str(len(body))}
    return InferenceResponse(status, headers, iter([body]), _nothing)


class Reply:
    """The documents and chunks of one answer (module docstring)."""

    def __init__(self, kind: ReplyKind, model: str) -> None:
        self.kind: ReplyKind = kind
        self.id = ("chatcmpl-" if kind == "chat" else "cmpl-") + secrets.token_hex(12)
        self.created = int(time.time())
        self.model = model
        self._role_sent = False

    def _head(self, obj: str) -> dict[str, JsonValue]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    @property
    def _chunk_object(self) -> str:
        return "chat.completion.chunk" if self.kind == "chat" else "text_completion"

    def document(self, text: str, finish_reason: str, usage: Usage) -> dict[str, JsonValue]:
        """The whole non-streamed answer as a JSON object."""
        if self.kind == "chat":
            doc = self._head("chat.completion")
            message: dict[str, JsonValue] = {"role": "assistant", "content": text}
            choice: dict[str, JsonValue] = {"index": 0, "message": message, "logprobs": None}
        else:
            doc = self._head("text_completion")
            choice = {"index": 0, "text": text, "logprobs": None}
        choice["finish_reason"] = finish_reason
        doc["choices"] = [choice]
        doc["usage"] = usage.to_json()
        return doc

    def answer(self, text: str, finish_reason: str, usage: Usage) -> InferenceResponse:
        """The whole non-streamed answer as a response."""
        return json_answer(self.document(text, finish_reason, usage))

    def chunk(self, text: str, finish_reason: str | None = None, usage: Usage | None = None) -> bytes:
        """One streamed chunk of ``text`` (the first chat chunk carries the assistant role)."""
        if self.kind == "chat":
            delta: dict[str, JsonValue] = {} if finish_reason is not None and not text else {"content": text}
            if not self._role_sent:
                delta = {"role": "assistant", **delta}
                self._role_sent = True
            choice: dict[str, JsonValue] = {"index": 0, "delta": delta}
        else:
            choice = {"index": 0, "text": text}
        choice["logprobs"] = None
        choice["finish_reason"] = finish_reason
        doc = self._head(self._chunk_object)
        doc["choices"] = [choice]
        if usage is not None:
            doc["usage"] = usage.to_json()
        return sse(doc)

    def usage_chunk(self, usage: Usage) -> bytes:
        """The ``stream_options.include_usage`` chunk: no choices, the usage."""
        return sse({**self._head(self._chunk_object), "choices": [], "usage": usage.to_json()})

    def end(self, finish_reason: str, usage: Usage, *, include_usage: bool = False) -> bytes:
        """The events closing a stream: the finish chunk with ``usage`` (or, with
        ``include_usage``, the finish chunk and then the usage chunk), then ``data: [DONE]``."""
        if include_usage:
            return self.chunk("", finish_reason) + self.usage_chunk(usage) + SSE_DONE
        return self.chunk("", finish_reason, usage) + SSE_DONE

    def stream(self, events: Iterable[bytes], close: Callable[[], None] = _nothing) -> InferenceResponse:
        """``events`` as a ``text/event-stream`` response; ``close`` stops the engine's work."""
        return InferenceResponse(200, dict(SSE_HEADERS), iter(events), close)


def error_event(message: str, *, code: str = "internal") -> bytes:
    """The events ending a stream that failed after it began (module docstring)."""
    error: dict[str, JsonValue] = {"message": message, "type": "server_error", "param": None, "code": code}
    return sse({"error": error}) + SSE_DONE


def error_answer(
    status: int, message: str, *, code: str, error_type: str | None = None, param: str | None = None
) -> InferenceResponse:
    """An OpenAI error document with HTTP ``status``; ``error_type`` defaults to
    ``invalid_request_error`` below 500 and ``server_error`` from 500 on."""
    kind = error_type or ("server_error" if status >= 500 else "invalid_request_error")
    error: dict[str, JsonValue] = {"message": message, "type": kind, "param": param, "code": code}
    return json_answer({"error": error}, status)

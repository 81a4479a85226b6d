"""Reading the OpenAI answer of the ``/v1`` path back: JSON documents and server-sent events.

The answers come from :class:`~werk_host.service.inference.InferenceService`, so an error
status already carries the host's sanitized OpenAI error (never a backend's own text). A 200
body that cannot be read as the OpenAI shape is the backend's fault: it is answered as a
retryable ``unavailable`` with a fixed message.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Final

from pydantic import JsonValue

from werk_host.errors import ErrorCode, WerkError
from werk_host.seam import JsonObject

#: The largest non-streamed OpenAI answer read back (an answer is output text plus metadata).
MAX_DOCUMENT_BYTES: Final = 32 << 20
#: The largest single server-sent event accepted from the backend.
MAX_EVENT_BYTES: Final = 4 << 20

UNREADABLE: Final = "the backend returned an answer that could not be read"
#: What a translated stream ends with when the backend failed inside it, or ended it unfinished.
STREAM_FAILED: Final = "the backend failed while generating the answer"
STREAM_CUT: Final = "the backend ended the stream before the answer was complete"


def unreadable() -> WerkError:
    return WerkError(ErrorCode.UNAVAILABLE, UNREADABLE, retryable=True)


def as_object(value: JsonValue | None) -> JsonObject | None:
    return value if isinstance(value, dict) else None


def as_count(value: JsonValue | None) -> int | None:
    """A token count: a non-negative JSON integer (never a boolean)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


@dataclass(frozen=True)
class Usage:
    """The OpenAI ``usage`` object's two counts, and of the prompt's, those the backend took
    from its cache (``prompt_tokens_details.cached_tokens``; ``None`` when it reports none)."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None = None

    @property
    def evaluated_tokens(self) -> int:
        """The prompt tokens the backend evaluated (not taken from its cache)."""
        return self.prompt_tokens - (self.cached_tokens or 0)

    @classmethod
    def of(cls, doc: JsonObject) -> Usage | None:
        usage = as_object(doc.get("usage"))
        if usage is None:
            return None
        prompt, completion = as_count(usage.get("prompt_tokens")), as_count(usage.get("completion_tokens"))
        if prompt is None or completion is None:
            return None
        cached = as_count((as_object(usage.get("prompt_tokens_details")) or {}).get("cached_tokens"))
        return cls(prompt, completion, None if cached is None else min(cached, prompt))


def first_choice(doc: JsonObject) -> JsonObject | None:
    """The answer's choice with index 0 (these routes always ask for one choice)."""
    choices = doc.get("choices")
    if not isinstance(choices, list):
        return None
    for choice in choices:
        found = as_object(choice)
        if found is not None and found.get("index", 0) == 0:
            return found
    return None


def text_of(value: JsonValue | None) -> str:
    return value if isinstance(value, str) else ""


def read_document(chunks: Iterable[bytes]) -> JsonObject:
    """The whole JSON object ``chunks`` make up (at most :data:`MAX_DOCUMENT_BYTES`)."""
    raw = bytearray()
    for chunk in chunks:
        raw += chunk
        if len(raw) > MAX_DOCUMENT_BYTES:
            raise unreadable()
    try:
        doc = json.loads(raw)
    except ValueError as err:
        raise unreadable() from err
    if not isinstance(doc, dict):
        raise unreadable()
    return doc


def error_message(raw: bytes) -> str | None:
    """``error.message`` of an OpenAI error body, when it has one."""
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    error = as_object(doc.get("error")) if isinstance(doc, dict) else None
    message = error.get("message") if error is not None else None
    return message if isinstance(message, str) and message else None


def _event_data(event: bytes) -> tuple[str, bytes] | None:
    """``(field, data)`` of one SSE event: its ``data:`` lines joined, or an ``error:`` line."""
    data: list[bytes] = []
    for line in event.splitlines():
        name, _, value = line.partition(b":")
        value = value[1:] if value.startswith(b" ") else value
        if name == b"data":
            data.append(value)
        elif name == b"error":  # llama-server reports a failure inside a stream this way
            return "error", value
    return ("data", b"\n".join(data)) if data else None


def sse_events(chunks: Iterable[bytes]) -> Iterator[JsonObject]:
    """The JSON objects of an OpenAI server-sent event stream, in order, up to ``[DONE]``.

    ``chunks`` is read to its end even after ``[DONE]`` (nothing more is yielded), so that the
    host's accounting of the relayed stream (its ``usage``) sees all of it. An ``error`` event
    is yielded as ``{"error": ...}``; the caller decides what the client sees. Comments and
    keep-alive lines are skipped. Raises ``unavailable`` for an event that is not JSON or too
    large."""
    pending = bytearray()
    done = False
    for chunk in chunks:
        if done:
            continue
        pending += chunk
        if b"\r" in pending:  # CRLF line ends (a lone CR at the end waits for its LF)
            pending = bytearray(pending.replace(b"\r\n", b"\n"))
        while (end := pending.find(b"\n\n")) >= 0:
            event = bytes(pending[:end])
            del pending[: end + 2]
            parsed = _event_data(event)
            if parsed is None:
                continue
            kind, data = parsed
            if kind == "data" and data.strip() == b"[DONE]":
                done = True
                break
            try:
                doc = json.loads(data)
            except ValueError as err:
                raise unreadable() from err
            if not isinstance(doc, dict):
                raise unreadable()
            yield {"error": doc} if kind == "error" else doc
        if len(pending) > MAX_EVENT_BYTES:
            raise unreadable()

"""Reading the OpenAI answer of the ``/v1`` path back: JSON documents and server-sent events.

The answers come from :class:`~werk_host.service.inference.InferenceService`, so an error
status already carries the host's sanitized OpenAI error (never a backend's own text). A 200
body that cannot be read as the OpenAI shape is the backend's fault: it is answered as a
retryable ``unavailable`` with a fixed message.

A translated stream writes once per backend read, not once per event: :func:`coalesced` joins
the pieces a translation makes while its next event is already buffered (:class:`SseEvents`),
and writes before any step that would wait for the backend, so no piece is held back from the
client while the backend computes (docs/operations.md, "Where relay time goes").
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
    return _json_object(raw)


def _json_object(raw: bytes | bytearray) -> JsonObject:
    """``raw`` parsed as one JSON object, else :func:`unreadable`."""
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


class SseEvents:
    """The JSON objects of an OpenAI server-sent event stream, in order, up to ``[DONE]``
    (:func:`sse_events`); :attr:`ready` says whether the next one (or the end) is at hand
    without reading the backend, which :func:`coalesced` uses to batch a translation's writes."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self._pending = bytearray()
        self._done = False
        self._ended = False

    def __iter__(self) -> SseEvents:
        return self

    @property
    def ready(self) -> bool:
        return self._ended or (not self._done and self._pending.find(b"\n\n") >= 0)

    def __next__(self) -> JsonObject:
        pending = self._pending
        while True:
            while not self._done and (end := pending.find(b"\n\n")) >= 0:
                event = bytes(pending[:end])
                del pending[: end + 2]
                parsed = _event_data(event)
                if parsed is None:
                    continue
                kind, data = parsed
                if kind == "data" and data.strip() == b"[DONE]":
                    self._done = True
                    break
                doc = _json_object(data)
                return {"error": doc} if kind == "error" else doc
            if len(pending) > MAX_EVENT_BYTES:
                raise unreadable()
            chunk = next(self._chunks, None)
            if chunk is None:
                self._ended = True
                raise StopIteration
            if self._done:
                continue
            pending += chunk
            if b"\r" in pending:  # CRLF line ends (a lone CR at the end waits for its LF)
                pending[:] = pending.replace(b"\r\n", b"\n")


def sse_events(chunks: Iterable[bytes]) -> SseEvents:
    """The JSON objects of an OpenAI server-sent event stream, in order, up to ``[DONE]``.

    ``chunks`` is read to its end even after ``[DONE]`` (nothing more is yielded), so that the
    host's accounting of the relayed stream (its ``usage``) sees all of it. An ``error`` event
    is yielded as ``{"error": ...}``; the caller decides what the client sees. Comments and
    keep-alive lines are skipped. Raises ``unavailable`` for an event that is not JSON or too
    large."""
    return SseEvents(chunks)


#: The most translated bytes :func:`coalesced` holds before it writes them.
MAX_COALESCED_BYTES: Final = 64 << 10


def coalesced(translated: Iterable[bytes], events: SseEvents) -> Iterator[bytes]:
    """``translated`` (a translation of ``events``) with the pieces made from events that arrived
    together joined into one write: a piece is held only while the next event is already at hand
    (:attr:`SseEvents.ready`), so nothing waits for the backend, and at most
    :data:`MAX_COALESCED_BYTES` are held (docs/operations.md, "Where relay time goes")."""
    held: list[bytes] = []
    size = 0
    pieces = iter(translated)
    try:
        while True:
            if held and (size >= MAX_COALESCED_BYTES or not events.ready):
                yield b"".join(held)
                held, size = [], 0
            try:
                piece = next(pieces)
            except StopIteration:
                break
            except Exception:
                if held:  # what was made before the failure still goes out first
                    yield b"".join(held)
                raise
            held.append(piece)
            size += len(piece)
        if held:
            yield b"".join(held)
    finally:
        close = getattr(pieces, "close", None)
        if callable(close):
            close()

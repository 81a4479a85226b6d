"""Reading an OpenAI ``/v1/chat/completions`` event stream (the one wire of ``werk chat``/``run``).

Both transports hand over the response body as byte chunks; :func:`read_turn` turns them into
text deltas (passed to a callback as they arrive) and a :class:`TurnResult`. A response is
*complete* only when a choice ended with a ``finish_reason``, the stream ended with
``data: [DONE]`` and no error event came: only then may a session record reuse evidence or
publish a snapshot (docs/chat.md, "Native snapshots").
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

from werk_host.seam import JsonObject

#: The longest single event line accepted; a longer one ends the stream as an error.
MAX_EVENT_BYTES: Final = 4 << 20
_DONE: Final = b"[DONE]"


@dataclass
class TurnResult:
    """What one streamed response produced."""

    text: str = ""
    finish_reason: str | None = None
    #: The event that carried ``usage`` (with the backend's own extra counters, if any).
    usage_event: JsonObject | None = None
    done: bool = False
    error: str | None = None
    #: Seconds from the request to the first content delta.
    first_token_s: float | None = None
    #: Ctrl-C stopped the turn (the response was closed, which cancels the generation).
    interrupted: bool = False

    @property
    def complete(self) -> bool:
        return self.finish_reason is not None and self.done and self.error is None and not self.interrupted

    @property
    def usage(self) -> JsonObject:
        usage = self.usage_event.get("usage") if self.usage_event is not None else None
        return usage if isinstance(usage, dict) else {}


def one_line(text: str, limit: int = 300) -> str:
    """``text`` on one line, at most ``limit`` characters (for error messages)."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def error_message(doc: object) -> str | None:
    """The message of an OpenAI-shaped error object (``{"error": {"message": ...}}``), if any."""
    if not isinstance(doc, dict):
        return None
    err = doc.get("error")
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        return one_line(err["message"])
    if isinstance(err, str):
        return one_line(err)
    return None


def _apply(event: JsonObject, result: TurnResult, on_text: Callable[[str], None], started: float) -> None:
    message = error_message(event)
    if message is not None:
        result.error = message
        return
    if isinstance(event.get("usage"), dict):
        result.usage_event = event
    choices = event.get("choices")
    if not isinstance(choices, list):
        return
    for choice in choices:
        if not isinstance(choice, dict) or choice.get("index", 0) != 0:
            continue
        delta = choice.get("delta")
        content = delta.get("content") if isinstance(delta, dict) else None
        if isinstance(content, str) and content:
            if result.first_token_s is None:
                result.first_token_s = time.monotonic() - started
            result.text += content
            on_text(content)
        finish = choice.get("finish_reason")
        if isinstance(finish, str):
            result.finish_reason = finish


def read_turn(
    chunks: Iterable[bytes], on_text: Callable[[str], None], *, started: float, into: TurnResult | None = None
) -> TurnResult:
    """Consume a server-sent event stream of chat-completion chunks into ``into`` (or a new
    result), which holds what arrived so far even when the read is interrupted.

    ``started`` is the ``time.monotonic()`` of the request (for the first-token time). Lines
    other than ``data:`` are ignored; a malformed event or an over-long line is an error."""
    result = into if into is not None else TurnResult()
    pending = b""
    for chunk in chunks:
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            line = line.rstrip(b"\r")
            if line.startswith(b"error:"):
                result.error = one_line(line[6:].decode("utf-8", "replace")) or "the backend reported an error"
                continue
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == _DONE:
                result.done = True
                continue
            try:
                event = json.loads(payload)
            except ValueError:
                result.error = "the server sent a malformed event"
                continue
            if isinstance(event, dict):
                _apply(event, result, on_text, started)
        if len(pending) > MAX_EVENT_BYTES:
            result.error = "the server sent an over-long event"
            break
    return result


__all__ = ["MAX_EVENT_BYTES", "TurnResult", "error_message", "one_line", "read_turn"]

"""The Anthropic Messages API as a translation of the ``/v1`` chat path (docs/compat.md).

Requests (``POST /v1/messages``, ``POST /v1/messages/count_tokens``) are validated by the models
of :mod:`werk_host.compat.anthropic_models` and become the OpenAI chat body of :func:`chat_body`
(or the :class:`~werk_host.protocol.ChatRequest` of :func:`count_request`), both made by
:mod:`werk_host.compat.anthropic_request`: system prompts and mid-conversation system entries,
text, image, tool use and tool result blocks, tools and tool choice, thinking (as a reasoning
tier), structured output. What the translation cannot honour is refused, never dropped; what
cannot change a local answer is accepted and ignored, as docs/compat.md lists.

Answers (:mod:`werk_host.compat.anthropic_answer`): the OpenAI ``chat.completion`` becomes a
``message`` with ``thinking``, ``text`` and ``tool_use`` blocks (:func:`message`); the OpenAI
stream becomes Anthropic's event sequence (:func:`message_stream`), whose ``message_delta``
carries the exact ``input_tokens`` and ``output_tokens`` (cumulative, as Anthropic defines them).

This module is the one the HTTP layer imports: the pieces above and Anthropic's error shape.
"""

from __future__ import annotations

from typing import Final

from werk_host.compat.anthropic_answer import (
    STOP_REASONS,
    error_event,
    message,
    message_stream,
    new_message_id,
    signature,
    sse,
    stop_of,
    tool_use_id,
    usage_document,
)
from werk_host.compat.anthropic_models import CountTokensRequest, MessagesRequest
from werk_host.compat.anthropic_request import chat_body, count_request, openai_messages, openai_tools, thinking_tier
from werk_host.compat.upstream import STREAM_CUT, STREAM_FAILED
from werk_host.seam import JsonObject

__all__ = [
    "ERROR_TYPES",
    "STOP_REASONS",
    "STREAM_CUT",
    "STREAM_FAILED",
    "CountTokensRequest",
    "MessagesRequest",
    "chat_body",
    "count_request",
    "error_document",
    "error_event",
    "error_type",
    "message",
    "message_stream",
    "new_message_id",
    "openai_messages",
    "openai_tools",
    "signature",
    "sse",
    "stop_of",
    "thinking_tier",
    "tool_use_id",
    "usage_document",
]

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


def error_type(status: int) -> str:
    return ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


def error_document(status: int, message_text: str, request_id: str) -> JsonObject:
    """Anthropic's error body: ``{"type": "error", "error": {"type", "message"}, "request_id"}``."""
    return {"type": "error", "error": {"type": error_type(status), "message": message_text}, "request_id": request_id}

"""The reference backend's constants, tokenizer and OpenAI answers (:mod:`werk_host.testing.reference`).

A token is a word; a chat request counts each message's words plus 2; answers are OpenAI JSON
or server-sent events ending ``data: [DONE]``, with ``usage`` in the final chunk when the
request asks for it (``stream_options.include_usage``).
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Final

from pydantic import ValidationError

from werk_host.errors import ErrorCode, WerkError, validation_message
from werk_host.protocol import CapabilityId, CapabilityStatus, ChatMessage, ChatRequest
from werk_host.seam import InferenceResponse, JsonObject

#: The name the reference plugin registers under (its adapters' owner).
PLUGIN_NAME: Final = "testbackend"
#: The backend id its adapters report (``active_backend``).
BACKEND_ID: Final = "test-backend"
#: ``werk_chat_limits`` of every model: context and output ceiling, in words.
CONTEXT_TOKENS: Final = 64
MAX_OUTPUT_TOKENS: Final = 63
#: Experts per model in the in-memory expert table, and the size each reports.
EXPERTS_PER_MODEL: Final = 8
EXPERT_BYTES: Final = 1 << 20

#: The default capability report: persistence/restore/disk/prefix-cache/P-D experimental,
#: chat planning supported, no RAM/VRAM tier (set ``runtime.state.tier.ram`` to enable one).
EXPERIMENTAL_STATE: Final[Mapping[CapabilityId, CapabilityStatus]] = {
    CapabilityId.MODEL_RESIDENCY: CapabilityStatus.SUPPORTED,
    CapabilityId.PERSISTENCE: CapabilityStatus.EXPERIMENTAL,
    CapabilityId.RESTORE: CapabilityStatus.EXPERIMENTAL,
    CapabilityId.TIER_DISK: CapabilityStatus.EXPERIMENTAL,
    CapabilityId.TIER_RAM: CapabilityStatus.UNSUPPORTED,
    CapabilityId.TIER_VRAM: CapabilityStatus.UNSUPPORTED,
    CapabilityId.PREFIX_CACHE: CapabilityStatus.EXPERIMENTAL,
    CapabilityId.PD_PREFILL: CapabilityStatus.EXPERIMENTAL,
    CapabilityId.PD_DECODE: CapabilityStatus.EXPERIMENTAL,
    CapabilityId.PD_HANDOFF: CapabilityStatus.EXPERIMENTAL,
    CapabilityId.TOKEN_COUNT: CapabilityStatus.SUPPORTED,
    CapabilityId.ADMISSION: CapabilityStatus.SUPPORTED,
    CapabilityId.CHAT_LIMITS: CapabilityStatus.SUPPORTED,
}


def _message_text(message: ChatMessage) -> str:
    if message.content is None:
        return ""
    if isinstance(message.content, str):
        return message.content
    return " ".join(part.text for part in message.content if part.text)


def count_chat_tokens(request: ChatRequest) -> int:
    """The reference tokenizer over a chat request: each message's words plus 2."""
    return sum(len(_message_text(m).split()) + 2 for m in request.messages)


def _chat_request(body: JsonObject) -> ChatRequest:
    try:  # ``werk`` may carry the host's resolved reasoning tier, which is not a request field
        return ChatRequest.model_validate({k: v for k, v in body.items() if k != "werk"})
    except ValidationError as err:
        raise WerkError(ErrorCode.INVALID_REQUEST, validation_message(err)) from err


def _output_tokens(body: JsonObject) -> int:
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return MAX_OUTPUT_TOKENS


def _echo(text: str, limit: int) -> tuple[list[str], str]:
    words = text.split()
    return words[:limit], "length" if len(words) > limit else "stop"


def _usage(prompt: int, completion: int) -> JsonObject:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _json_response(doc: JsonObject) -> InferenceResponse:
    body = json.dumps(doc).encode()
    headers = {"Content-Type": "application/json", "Content-Length": str(len(body))}
    return InferenceResponse(200, headers, iter([body]), lambda: None)


def _sse_response(events: Iterable[JsonObject]) -> InferenceResponse:
    """Server-sent events, one ``data:`` line per event, then ``data: [DONE]``; ``close`` stops it."""
    closed = threading.Event()

    def body() -> Iterator[bytes]:
        for event in events:
            if closed.is_set():
                return
            yield b"data: " + json.dumps(event).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"

    headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    return InferenceResponse(200, headers, body(), closed.set)


def _include_usage(body: JsonObject) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def session_tokens(request: ChatRequest) -> list[str]:
    """The reference tokenizer's tokens of a chat request: ``<role>``, the words, ``</>`` per
    message (as many as :func:`count_chat_tokens` counts)."""
    return [t for m in request.messages for t in (f"<{m.role}>", *_message_text(m).split(), "</>")]


def chat_answer(model: str, request: JsonObject, out: list[str], finish: str, usage: JsonObject) -> InferenceResponse:
    """The chat-completion response (streamed when asked) carrying ``out`` and ``usage``."""
    ident, created = f"chatcmpl-{secrets.token_hex(8)}", int(time.time())
    head: JsonObject = {"id": ident, "created": created, "model": model}
    if request.get("stream") is True:
        return _sse_response(_chat_chunks(head, out, finish, usage if _include_usage(request) else None))
    message: JsonObject = {"role": "assistant", "content": " ".join(out)}
    choice: JsonObject = {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
    return _json_response({**head, "object": "chat.completion", "choices": [choice], "usage": usage})


def _chat_chunks(head: JsonObject, out: list[str], finish: str, usage: JsonObject | None) -> Iterator[JsonObject]:
    def chunk(delta: JsonObject, finish_reason: str | None = None) -> JsonObject:
        choice: JsonObject = {"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}
        return {**head, "object": "chat.completion.chunk", "choices": [choice]}

    yield chunk({"role": "assistant", "content": ""})
    for i, word in enumerate(out):
        yield chunk({"content": word if i == 0 else f" {word}"})
    yield chunk({}, finish)
    if usage is not None:
        yield {**head, "object": "chat.completion.chunk", "choices": [], "usage": usage}

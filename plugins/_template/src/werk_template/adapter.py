"""The echo backend: answers a chat with the last user message, word by word.

A "token" is a whitespace-separated word and every message costs its words plus two (the
chat template's role markers), so ``count_tokens`` equals the ``/v1`` usage exactly. Its only
"process" is the adapter object; :meth:`EchoAdapter.reload` replaces it (a new generation),
which is what the conformance suite's identity check needs.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from pydantic import JsonValue

from werk_host.backend import InferenceResponse, JsonObject
from werk_host.config import HostConfig
from werk_host.errors import ErrorCode, WerkError
from werk_host.models import ModelManifest
from werk_host.protocol import ChatLimits

BACKEND_ID = "echo"
PLUGIN_NAME = "template"
CONTEXT_TOKENS = 4096
TEMPLATE_TOKENS_PER_MESSAGE = 2


def message_tokens(messages: list[JsonValue]) -> int:
    """The prompt size of ``messages``: words plus the template's two per message."""
    total = 0
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        total += len(content.split()) if isinstance(content, str) else 0
        total += TEMPLATE_TOKENS_PER_MESSAGE
    return total


def last_user_text(messages: list[JsonValue]) -> str:
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user" and isinstance(message.get("content"), str):
            return str(message["content"])
    return ""


@dataclass
class EchoAdapter:
    """One loaded echo "model"; ``generation`` changes when the backend is replaced."""

    manifest: ModelManifest
    instance_id: str = ""
    backend: str = BACKEND_ID
    plugin_name: str = PLUGIN_NAME
    generation: str = field(default_factory=lambda: secrets.token_hex(8))
    closed: bool = False

    def __post_init__(self) -> None:
        self.instance_id = self.instance_id or f"{BACKEND_ID}:{self.manifest.name}"

    def identity(self) -> str:
        return f"{self.instance_id}#{self.generation}"

    def reload(self) -> None:
        """Replace the backend (here: start a new generation)."""
        self.generation = secrets.token_hex(8)

    def close(self) -> None:
        self.closed = True

    def limits(self, model: str | None) -> ChatLimits:
        return ChatLimits(
            model=model or self.manifest.name,
            context_tokens=CONTEXT_TOKENS,
            max_output_tokens=CONTEXT_TOKENS - 1,
            max_concurrent_requests=None,
        )

    def complete(self, request: JsonObject) -> InferenceResponse:
        messages = request.get("messages")
        if not isinstance(messages, list):
            raise WerkError(ErrorCode.INVALID_REQUEST, "messages must be a list")
        max_tokens = request.get("max_tokens")
        limit = max_tokens if isinstance(max_tokens, int) else CONTEXT_TOKENS - 1
        words = last_user_text(messages).split()[:limit]
        usage = {
            "prompt_tokens": message_tokens(messages),
            "completion_tokens": len(words),
            "total_tokens": message_tokens(messages) + len(words),
        }
        finish = "length" if len(last_user_text(messages).split()) > limit else "stop"
        base: dict[str, object] = {
            "id": f"chatcmpl-{secrets.token_hex(6)}",
            "created": int(time.time()),
            "model": self.manifest.name,
        }
        if request.get("stream") is True:
            return InferenceResponse(
                200, {"Content-Type": "text/event-stream"}, _stream(base, words, finish, usage), lambda: None
            )
        doc: dict[str, object] = {
            **base,
            "object": "chat.completion",
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": " ".join(words)}, "finish_reason": finish}
            ],
            "usage": usage,
        }
        return InferenceResponse(
            200, {"Content-Type": "application/json"}, iter([json.dumps(doc).encode()]), lambda: None
        )


def _stream(base: dict[str, object], words: list[str], finish: str, usage: dict[str, int]) -> Iterator[bytes]:
    for i, word in enumerate(words):
        delta = {"content": word if i == 0 else f" {word}"}
        chunk: dict[str, object] = {
            **base,
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
        }
        yield f"data: {json.dumps(chunk)}\n\n".encode()
    last: dict[str, object] = {
        **base,
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {}, "finish_reason": finish}],
        "usage": usage,
    }
    yield f"data: {json.dumps(last)}\n\ndata: [DONE]\n\n".encode()


def accepts(manifest: ModelManifest | None) -> bool:
    """Only models registered for this backend (``werk models add NAME FILE --backend echo``)."""
    return manifest is not None and manifest.backend in (BACKEND_ID, PLUGIN_NAME)


def create_adapter(config: HostConfig, manifest: ModelManifest | None) -> EchoAdapter:
    if manifest is None:
        raise WerkError(ErrorCode.INVALID_REQUEST, "the echo backend needs a model")
    return EchoAdapter(manifest)

"""The template backend: an in-process "engine" that answers a chat with its last user message.

A "token" is a whitespace-separated word and every message costs its words plus two (its role
markers), so ``count_tokens`` equals the ``/v1`` usage exactly. Its only
"process" is the adapter object; :meth:`TemplateAdapter.reload` replaces it (a new
generation), which is what the conformance suite's identity check needs.

Each backend operation is one adapter method marked ``@hookimpl(specname=...)``: the host
registers the adapter with its plugin manager when it creates it, so the method *is* the hook
(docs/plugin-kit.md). Operations left out (prefill, decode, states, experts, …) are answered
``unsupported`` by the host. The answers are written by :mod:`werk_host.plugin.openai`.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field

from pydantic import JsonValue

from werk_host.plugin import (
    CapabilityId,
    CapabilityReport,
    CapabilityStatus,
    ChatLimits,
    ChatRequest,
    ErrorCode,
    HostConfig,
    InferenceResponse,
    JsonObject,
    ModelManifest,
    WerkError,
    hookimpl,
)
from werk_host.plugin.openai import Reply, Usage

# COPIERS: your backend id (what `werk models add ... --backend ID` and profiles name, and what
# /werk/v1 reports as active_backend). Use your entry-point name, as here.
BACKEND_ID = "template"
CONTEXT_TOKENS = 4096
ROLE_TOKENS_PER_MESSAGE = 2

# COPIERS: the capability ids your adapter reports on, each with what its evidence is
# (docs/plugin-kit.md, "Capabilities"); the factory declares exactly these.
REPORTED: dict[CapabilityId, str] = {
    CapabilityId.MODEL_RESIDENCY: "the template model lives in the werk serve process",
    CapabilityId.TOKEN_COUNT: "exact: words plus two per message, as the usage reports",
    CapabilityId.ADMISSION: "from the exact token count",
    CapabilityId.CHAT_LIMITS: "a fixed 4,096-token context",
}


# COPIERS: the engine calls. Replace these two with your engine's tokenizer and generation.
def message_tokens(messages: list[JsonValue]) -> int:
    """The prompt size of ``messages``: words plus two role markers per message."""
    total = 0
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        total += len(content.split()) if isinstance(content, str) else 0
        total += ROLE_TOKENS_PER_MESSAGE
    return total


def last_user_text(messages: list[JsonValue]) -> str:
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user" and isinstance(message.get("content"), str):
            return str(message["content"])
    return ""


def _include_usage(request: JsonObject) -> bool:
    options = request.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


@dataclass
class TemplateAdapter:
    """One loaded template "model"; ``generation`` changes when the backend is replaced."""

    manifest: ModelManifest
    instance_id: str = ""
    backend: str = BACKEND_ID
    generation: str = field(default_factory=lambda: secrets.token_hex(8))
    closed: bool = False

    def __post_init__(self) -> None:
        self.instance_id = self.instance_id or f"{BACKEND_ID}:{self.manifest.name}"

    # COPIERS: identity() must change whenever your engine or backend process is replaced.
    def identity(self) -> str:
        return f"{self.instance_id}#{self.generation}"

    def reload(self) -> None:
        """Replace the backend (here: start a new generation)."""
        self.generation = secrets.token_hex(8)

    def close(self) -> None:
        self.closed = True

    # -- operation hooks (docs/plugin-hooks.md) --------------------------------------------------
    @hookimpl(specname="werk_capabilities")
    def capabilities(self) -> dict[CapabilityId, CapabilityReport]:
        return {cap_id: CapabilityReport(CapabilityStatus.SUPPORTED, detail) for cap_id, detail in REPORTED.items()}

    @hookimpl(specname="werk_count_tokens")
    def count_tokens(self, request: ChatRequest) -> int:
        return message_tokens([m.model_dump(mode="json") for m in request.messages])

    @hookimpl(specname="werk_chat_limits")
    def chat_limits(self, model: str | None) -> ChatLimits:
        return ChatLimits(
            model=model or self.manifest.name,
            context_tokens=CONTEXT_TOKENS,
            max_output_tokens=CONTEXT_TOKENS - 1,
            max_concurrent_requests=None,
        )

    @hookimpl(specname="werk_chat_completion")
    def chat(self, request: JsonObject) -> InferenceResponse:
        messages = request.get("messages")
        if not isinstance(messages, list):
            raise WerkError(ErrorCode.INVALID_REQUEST, "messages must be a list")
        max_tokens = request.get("max_tokens")
        limit = max_tokens if isinstance(max_tokens, int) else CONTEXT_TOKENS - 1
        everything = last_user_text(messages).split()
        words = everything[:limit]
        finish = "length" if len(everything) > limit else "stop"
        usage = Usage(prompt_tokens=message_tokens(messages), completion_tokens=len(words))
        reply = Reply("chat", self.manifest.name)
        if request.get("stream") is not True:
            return reply.answer(" ".join(words), finish, usage)

        def events() -> Iterator[bytes]:
            for i, word in enumerate(words):
                yield reply.chunk(word if i == 0 else f" {word}")
            yield reply.end(finish, usage, include_usage=_include_usage(request))

        return reply.stream(events())


def accepts(manifest: ModelManifest | None) -> bool:
    """Only models registered for this backend (``werk models add NAME FILE --backend template``)."""
    return manifest is not None and manifest.backend == BACKEND_ID


# COPIERS: create your adapter here. Start nothing yet if you can (load on first use).
def create_adapter(config: HostConfig, manifest: ModelManifest | None) -> TemplateAdapter:
    if manifest is None:
        raise WerkError(ErrorCode.INVALID_REQUEST, "the template backend needs a model")
    return TemplateAdapter(manifest)

"""The reference backend's prompt cache (the ``werk_prompt_cache`` seam; docs/prompt-cache.md).

Off unless a test sets ``MemoryAdapter.prompt_cache`` (a slot count; :mod:`.reference_adapter`):
then the adapter has ``slots`` ordinary slots, each holding the tokens of its last request (its
"KV") and the owner they belong to. A token is a word of :func:`~.reference_base.session_tokens`,
as an integer (its CRC-32). A request reuses its slot's tokens up to the common prefix with its
prompt — reported as ``prompt_tokens_details.cached_tokens`` — then leaves its prompt and answer
there. A lease erases a slot that held another owner's tokens; a saved entry is the slot's
tokens as JSON; a restore loads them. ``fail`` switches (:meth:`MemoryAdapter.check`):
``prompt_save``, ``prompt_restore``, and ``prompt_unused`` (a restore the next request does not
reuse, as a sliding-window cache would do without its full size).
"""

from __future__ import annotations

import json
import threading
import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from werk_host.errors import ErrorCode, WerkError
from werk_host.seam import InferenceResponse, JsonObject, SavedPrompt, Snapshot, StoredStateRef
from werk_host.testing.reference_base import (
    _chat_request,
    _echo,
    _message_text,
    _output_tokens,
    _usage,
    chat_answer,
    session_tokens,
)

if TYPE_CHECKING:
    from werk_host.testing.reference_adapter import MemoryAdapter

BACKEND_LAYOUT = "reference-prompt-1"


def token_ids(words: list[str]) -> list[int]:
    return [zlib.crc32(w.encode()) for w in words]


@dataclass
class MemorySlot:
    owner: str | None = None
    tokens: list[int] = field(default_factory=list)


@dataclass
class MemoryPromptCache:
    """The reference adapter's slots as prompt caches (see the module docstring)."""

    adapter: MemoryAdapter
    slots: list[MemorySlot]
    busy: set[int] = field(default_factory=set)
    unavailable: str | None = None
    lock: threading.Condition = field(default_factory=threading.Condition)

    def cache_key(self) -> dict[str, str]:
        return {"backend": self.adapter.backend, "model": self.adapter.model_name, "layout": BACKEND_LAYOUT}

    def unavailable_reason(self) -> str | None:
        return self.unavailable

    def invalidate(self, reason: str) -> None:
        self.unavailable = f"a restored prefix was not reused ({reason})"

    def prompt_tokens(self, path: str, request: JsonObject) -> list[int] | None:
        if path != "/v1/chat/completions":
            return None
        return token_ids(session_tokens(_chat_request(request)))

    def lease(self, owner: str, tokens: list[int] | None) -> MemoryLease:
        with self.lock:
            while len(self.busy) == len(self.slots):
                self.lock.wait()
            free = [i for i in range(len(self.slots)) if i not in self.busy]
            index = max(free, key=lambda i: _shared(self.slots[i], owner, tokens))
            self.busy.add(index)
        slot = self.slots[index]
        if slot.owner is not None and slot.owner != owner:
            slot.tokens = []  # erased: another owner's tokens are never reused
        slot.owner = owner
        return MemoryLease(self, index, slot, _shared(slot, owner, tokens))


def _shared(slot: MemorySlot, owner: str, tokens: list[int] | None) -> int:
    if tokens is None or slot.owner != owner:
        return 0
    n = 0
    for a, b in zip(slot.tokens, tokens, strict=False):
        if a != b:
            break
        n += 1
    return n


@dataclass
class MemoryLease:
    cache: MemoryPromptCache
    index: int
    slot: MemorySlot
    held: int
    released: bool = False

    def restore(self, stored: StoredStateRef) -> int:
        adapter = self.cache.adapter
        if stored.compat_key != self.cache.cache_key():
            raise WerkError(ErrorCode.INCOMPATIBLE_STATE, "saved under another configuration")
        try:
            adapter.check("prompt_restore")
            with stored.open_payload() as payload:
                tokens = json.loads(payload.read())
            if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
                raise WerkError(ErrorCode.CORRUPT_STATE, "not a reference prompt cache entry")
        except (WerkError, ValueError) as err:
            self.slot.tokens = []
            if isinstance(err, WerkError):
                raise
            raise WerkError(ErrorCode.CORRUPT_STATE, "not a reference prompt cache entry") from err
        self.slot.tokens = [] if "prompt_unused" in adapter.fail else tokens
        return len(tokens)

    def forward(self, path: str, request: JsonObject) -> InferenceResponse:
        adapter = self.cache.adapter
        adapter.check("chat")
        chat = _chat_request(request)
        prompt = token_ids(session_tokens(chat))
        cached = _shared(self.slot, self.slot.owner or "", prompt)
        words, finish = _echo(_message_text(chat.messages[-1]), _output_tokens(request))
        self.slot.tokens = [*prompt, *token_ids(words)]
        usage: JsonObject = {**_usage(len(prompt), len(words)), "prompt_tokens_details": {"cached_tokens": cached}}
        return chat_answer(adapter.model_name, request, words, finish, usage)

    def cached_tokens(self, usage_event: JsonObject) -> int | None:
        usage = usage_event.get("usage")
        details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        return cached if isinstance(cached, int) and not isinstance(cached, bool) and cached >= 0 else None

    def save(self) -> SavedPrompt | None:
        self.cache.adapter.check("prompt_save")
        data = json.dumps(self.slot.tokens).encode()
        snapshot = Snapshot(chunks=[data], size=len(data), close=lambda: None)
        return SavedPrompt(snapshot=snapshot, tokens=tuple(self.slot.tokens))

    def release(self) -> None:
        with self.cache.lock:
            if self.released:
                return
            self.released = True
            self.cache.busy.discard(self.index)
            self.cache.lock.notify_all()

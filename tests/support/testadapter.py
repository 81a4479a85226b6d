"""An inline test adapter plugin that keeps opaque state bytes in memory.

It is a real plugin (registered through pluggy like any other) whose capability report is
configurable, so conformance tests can check that behaviour follows every status. Its
"backend" is trivial: a prompt's state is its UTF-8 bytes; decode echoes a bounded number
of words. Failure injection lets tests break prefill, snapshot and decode.
"""

from __future__ import annotations

import io
import itertools
import json
import secrets
import threading
from dataclasses import dataclass, field
from typing import Any

from werk_host import hookimpl
from werk_host.backend import (
    AdapterFactory,
    CapabilityReport,
    DecodeOutput,
    DecodeWork,
    InferenceResponse,
    MoveOutput,
    MoveWork,
    PrefilledState,
    PrefillWork,
    Snapshot,
    StoredStateRef,
)
from werk_host.errors import ErrorCode, WerkError
from werk_host.protocol import CapabilityStatus, ChatLimits, ChatRequest, MessagesInput

PLUGIN_NAME = "testbackend"
BACKEND_ID = "test-backend"

EXPERIMENTAL_STATE = {
    "runtime.model_residency": CapabilityStatus.SUPPORTED,
    "runtime.state.persistence": CapabilityStatus.EXPERIMENTAL,
    "runtime.state.restore": CapabilityStatus.EXPERIMENTAL,
    "runtime.state.tier.disk": CapabilityStatus.EXPERIMENTAL,
    "runtime.state.tier.ram": CapabilityStatus.UNSUPPORTED,
    "runtime.state.tier.vram": CapabilityStatus.UNSUPPORTED,
    "runtime.state.prefix_cache": CapabilityStatus.EXPERIMENTAL,
    "runtime.pd.prefill": CapabilityStatus.EXPERIMENTAL,
    "runtime.pd.decode": CapabilityStatus.EXPERIMENTAL,
    "runtime.pd.handoff": CapabilityStatus.EXPERIMENTAL,
    "api.chat.token_count": CapabilityStatus.SUPPORTED,
    "api.chat.admission": CapabilityStatus.SUPPORTED,
    "api.chat.limits": CapabilityStatus.SUPPORTED,
}


@dataclass
class MemoryAdapter:
    """A test adapter; ``statuses`` is what it reports, ``fail`` names operations to break."""

    model_name: str
    instance_id: str = ""
    backend: str = BACKEND_ID
    plugin_name: str = PLUGIN_NAME
    statuses: dict[str, CapabilityStatus] = field(default_factory=lambda: dict(EXPERIMENTAL_STATE))
    fail: set[str] = field(default_factory=set)
    generation: str = field(default_factory=lambda: secrets.token_hex(8))
    live: dict[int, bytes] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    closed: bool = False
    memory_requirement: int | None = None
    _ids: Any = field(default_factory=itertools.count)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.instance_id = self.instance_id or f"test:{self.model_name}"

    def identity(self) -> str:
        return f"{self.instance_id}#{self.generation}"

    def restart(self) -> None:
        """Simulate a backend process restart: new generation, live handles gone."""
        self.generation = secrets.token_hex(8)
        self.live.clear()

    def envelope(self) -> dict[str, str]:
        return {"backend": BACKEND_ID, "model": self.model_name, "generation": self.generation, "layout": "1"}

    def close(self) -> None:
        self.closed = True

    def _maybe_fail(self, op: str) -> None:
        """``fail`` holding ``op`` raises a typed error; holding ``crash:op`` raises an unexpected one."""
        self.calls.append(op)
        if op in self.fail:
            raise WerkError(ErrorCode.INTERNAL, f"injected {op} failure")
        if f"crash:{op}" in self.fail:
            raise RuntimeError(f"injected {op} crash")


def _prompt_bytes(work: PrefillWork) -> bytes:
    if isinstance(work.input, MessagesInput):
        return json.dumps([m.model_dump(mode="json") for m in work.input.messages]).encode()
    return work.input.text.encode()


class MemoryBackendPlugin:
    """The plugin object: offers ``MemoryAdapter`` and implements every operation hook."""

    def __init__(self, **adapter_kwargs: Any) -> None:
        self.adapter_kwargs = adapter_kwargs
        self.adapters: list[MemoryAdapter] = []

    def _create(self, config: Any, model: Any) -> MemoryAdapter:
        adapter = MemoryAdapter(model_name=model.name if model else "none", **self.adapter_kwargs)
        self.adapters.append(adapter)
        return adapter

    @hookimpl
    def werk_adapter_factories(self, config: Any) -> list[AdapterFactory]:
        return [AdapterFactory(BACKEND_ID, PLUGIN_NAME, lambda m: m is not None, self._create, "in-memory test")]

    @hookimpl
    def werk_capabilities(self, adapter: MemoryAdapter) -> dict[str, CapabilityReport]:
        return {k: CapabilityReport(v, f"test adapter reports {v.value}") for k, v in adapter.statuses.items()}

    @hookimpl
    def werk_producer_envelope(self, adapter: MemoryAdapter, model_id: str) -> dict[str, str]:
        return adapter.envelope()

    @hookimpl
    def werk_prefill(self, adapter: MemoryAdapter, work: PrefillWork) -> PrefilledState:
        adapter._maybe_fail("prefill")
        data = _prompt_bytes(work)
        if data.startswith(b"FAIL"):
            raise WerkError(ErrorCode.INTERNAL, "injected prefill failure for this prompt")
        with adapter._lock:
            handle = next(adapter._ids)
            adapter.live[handle] = data
        return PrefilledState(
            handle=handle,
            prompt_tokens=len(data.split()),
            envelope=adapter.envelope(),
            snapshot_capable="no-snapshot" not in adapter.fail,
            bytes=len(data),
        )

    @hookimpl
    def werk_snapshot(self, adapter: MemoryAdapter, state: PrefilledState) -> Snapshot:
        adapter._maybe_fail("snapshot")
        data = adapter.live[state.handle]
        return Snapshot(chunks=[data[i : i + 7] for i in range(0, len(data), 7)], size=len(data), close=lambda: None)

    @hookimpl
    def werk_restore(self, adapter: MemoryAdapter, stored: StoredStateRef) -> PrefilledState:
        with stored.open_payload() as payload:
            data = payload.read()
        with adapter._lock:
            handle = next(adapter._ids)
            adapter.live[handle] = data
        return PrefilledState(handle, len(data.split()), adapter.envelope(), True, bytes=len(data))

    @hookimpl
    def werk_decode(self, adapter: MemoryAdapter, work: DecodeWork) -> DecodeOutput:
        adapter._maybe_fail("decode")
        data = adapter.live.get(work.handle) if work.handle is not None else None
        if data is None:
            if work.stored is None:
                raise WerkError(ErrorCode.UNAVAILABLE, "live state is gone and nothing is stored")
            adapter.calls.append("restore")
            with work.stored.open_payload() as payload:
                data = payload.read()
        words = data.decode(errors="replace").split()
        out = words[: work.options.max_tokens]
        finish = "length" if len(words) > work.options.max_tokens else "stop"
        text = " ".join(out)
        if "huge-text" in adapter.fail:
            text = "x" * ((1 << 20) + 1)
        next_state = None
        if "continue" in adapter.fail:
            next_state = PrefilledState(None, len(out), adapter.envelope(), False)
        return DecodeOutput(text=text, completion_tokens=len(out), finish_reason=finish, next_state=next_state)

    @hookimpl
    def werk_release_state(self, adapter: MemoryAdapter, handle: Any) -> bool:
        with adapter._lock:
            return adapter.live.pop(handle, None) is not None

    @hookimpl
    def werk_state_move(self, adapter: MemoryAdapter, work: MoveWork) -> MoveOutput:
        raise WerkError(ErrorCode.UNSUPPORTED, "the test backend has no other tiers")

    @hookimpl
    def werk_count_tokens(self, adapter: MemoryAdapter, request: ChatRequest) -> int:
        adapter._maybe_fail("count")
        return sum(len(str(m.content or "").split()) + 2 for m in request.messages)

    @hookimpl
    def werk_chat_limits(self, adapter: MemoryAdapter, model: str | None) -> ChatLimits:
        return ChatLimits(model=model or adapter.model_name, context_tokens=64, max_output_tokens=63, max_concurrent_requests=1)

    @hookimpl
    def werk_chat_completion(self, adapter: MemoryAdapter, request: dict[str, Any]) -> InferenceResponse:
        body = json.dumps({"object": "chat.completion", "choices": [{"message": {"role": "assistant", "content": "ok"}}]})
        stream = io.BytesIO(body.encode())
        return InferenceResponse(200, {"Content-Type": "application/json"}, iter([stream.read()]), lambda: None)

    @hookimpl
    def werk_memory_requirement(self, adapter: MemoryAdapter, operation: str, model_id: str) -> int | None:
        return adapter.memory_requirement

    @hookimpl
    def werk_list_models(self, adapter: MemoryAdapter) -> list[dict[str, Any]]:
        return [{"id": adapter.model_name, "object": "model", "owned_by": "werk"}]



"""werk-llamacpp's hook implementations: the llama.cpp backend for Werk host."""

from __future__ import annotations

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
from werk_host.protocol import ChatLimits, ChatRequest, ReasoningProfile, WorkerObservation
from werk_host.service.reasoning import unsupported_profile

from .adapter import BACKEND_ID, PLUGIN_NAME, LlamaCppAdapter, accepts, create_adapter
from .proxy import forward


@hookimpl
def werk_adapter_factories(config: Any) -> list[AdapterFactory]:
    return [AdapterFactory(BACKEND_ID, PLUGIN_NAME, accepts, create_adapter, "managed llama-server (GGUF)")]


@hookimpl
def werk_capabilities(adapter: Any) -> dict[str, CapabilityReport] | None:
    return adapter.capabilities() if isinstance(adapter, LlamaCppAdapter) else None


@hookimpl
def werk_producer_envelope(adapter: Any, model_id: str) -> dict[str, str] | None:
    if not isinstance(adapter, LlamaCppAdapter):
        return None
    proc = adapter.current()
    if proc is None or model_id != adapter.manifest.name:
        raise WerkError(ErrorCode.UNAVAILABLE, "no live llama-server for this model", retryable=True)
    return adapter.envelope(proc)


@hookimpl
def werk_prefill(adapter: Any, work: PrefillWork) -> PrefilledState | None:
    return adapter.prefill(work) if isinstance(adapter, LlamaCppAdapter) else None


@hookimpl
def werk_snapshot(adapter: Any, state: PrefilledState) -> Snapshot | None:
    return adapter.snapshot(state) if isinstance(adapter, LlamaCppAdapter) else None


@hookimpl
def werk_restore(adapter: Any, stored: StoredStateRef) -> PrefilledState | None:
    return adapter.restore(stored) if isinstance(adapter, LlamaCppAdapter) else None


@hookimpl
def werk_decode(adapter: Any, work: DecodeWork) -> DecodeOutput | None:
    return adapter.decode(work) if isinstance(adapter, LlamaCppAdapter) else None


@hookimpl
def werk_release_state(adapter: Any, handle: Any) -> bool | None:
    return adapter.release(handle) if isinstance(adapter, LlamaCppAdapter) else None


@hookimpl
def werk_state_move(adapter: Any, work: MoveWork) -> MoveOutput | None:
    if not isinstance(adapter, LlamaCppAdapter):
        return None
    raise WerkError(ErrorCode.UNSUPPORTED, "llama.cpp named states live on disk only; ram/vram tiers are unsupported")


@hookimpl
def werk_count_tokens(adapter: Any, request: ChatRequest) -> int | None:
    return adapter.count_tokens(request) if isinstance(adapter, LlamaCppAdapter) else None


@hookimpl
def werk_chat_limits(adapter: Any, model: str | None) -> ChatLimits | None:
    return adapter.chat_limits(model) if isinstance(adapter, LlamaCppAdapter) else None


@hookimpl
def werk_reasoning_profile(adapter: Any, model: str | None, max_output_tokens: int) -> ReasoningProfile | None:
    if not isinstance(adapter, LlamaCppAdapter):
        return None
    # No budget control has been verified for this runtime's template: report that truthfully.
    return unsupported_profile(model or adapter.manifest.name, BACKEND_ID)


def _proxy(adapter: LlamaCppAdapter, path: str, request: dict[str, Any]) -> InferenceResponse:
    proc = adapter.process()
    pool = adapter.proxy_pool(proc)
    adapter.forget_slot()
    body = {k: v for k, v in request.items() if k != "werk"}
    body["cache_prompt"] = True
    return forward(pool, path, body)


@hookimpl
def werk_chat_completion(adapter: Any, request: dict[str, Any]) -> InferenceResponse | None:
    return _proxy(adapter, "/v1/chat/completions", request) if isinstance(adapter, LlamaCppAdapter) else None


@hookimpl
def werk_text_completion(adapter: Any, request: dict[str, Any]) -> InferenceResponse | None:
    return _proxy(adapter, "/v1/completions", request) if isinstance(adapter, LlamaCppAdapter) else None


@hookimpl
def werk_list_models(adapter: Any) -> list[dict[str, Any]] | None:
    if not isinstance(adapter, LlamaCppAdapter):
        return None
    return [{"id": adapter.manifest.name, "object": "model", "owned_by": "werk", "created": 0}]


@hookimpl
def werk_workers(adapter: Any) -> list[WorkerObservation] | None:
    return adapter.workers() if isinstance(adapter, LlamaCppAdapter) else None




"""werk-llamacpp's hook implementations: the llama.cpp backend for Werk host.

The host dispatches operation hooks only to the plugin that owns the adapter
(docs/plugin-hooks.md, "Dispatch rules"), so every ``adapter`` here is a
:class:`LlamaCppAdapter` this plugin created.
"""

from __future__ import annotations

from werk_host.plugin import (
    AdapterFactory,
    CapabilityId,
    CapabilityReport,
    ChatLimits,
    ChatRequest,
    DecodeOutput,
    DecodeWork,
    DeploymentPlan,
    DoctorCheck,
    ErrorCode,
    HostConfig,
    InferenceResponse,
    JsonObject,
    MoveOutput,
    MoveWork,
    PrefilledState,
    PrefillWork,
    ReasoningProfile,
    Snapshot,
    StoredStateRef,
    WerkError,
    WorkerObservation,
    hookimpl,
)

from . import doctor, reasoning
from .adapter import BACKEND_ID, LlamaCppAdapter, accepts, create_adapter
from .capabilities import REPORTED_CAPABILITIES
from .cli import werk_cli_commands as werk_cli_commands  # `werk llamacpp`; `werk` imports only .cli
from .options import validate_options
from .session import LlamaSessionSnapshots, session_snapshots
from .slots import forward_ordinary


@hookimpl
def werk_adapter_factories(config: HostConfig) -> list[AdapterFactory]:
    return [
        AdapterFactory(
            BACKEND_ID,
            accepts,
            create_adapter,
            "managed llama-server (GGUF)",
            capabilities=REPORTED_CAPABILITIES,
            validate_options=validate_options,
        )
    ]


@hookimpl
def werk_doctor_checks(config: HostConfig) -> list[DoctorCheck]:
    return doctor.checks(config)


@hookimpl
def werk_capabilities(adapter: LlamaCppAdapter) -> dict[CapabilityId, CapabilityReport]:
    return adapter.capabilities()


@hookimpl
def werk_producer_envelope(adapter: LlamaCppAdapter, model_id: str) -> dict[str, str]:
    return adapter.producer_envelope(model_id)


@hookimpl
def werk_prefill(adapter: LlamaCppAdapter, work: PrefillWork) -> PrefilledState:
    return adapter.prefill(work)


@hookimpl
def werk_snapshot(adapter: LlamaCppAdapter, state: PrefilledState) -> Snapshot:
    return adapter.snapshot(state)


@hookimpl
def werk_restore(adapter: LlamaCppAdapter, stored: StoredStateRef) -> PrefilledState:
    return adapter.restore(stored)


@hookimpl
def werk_decode(adapter: LlamaCppAdapter, work: DecodeWork) -> DecodeOutput:
    return adapter.decode(work)


@hookimpl
def werk_release_state(adapter: LlamaCppAdapter, handle: object) -> bool:
    return adapter.release(handle)


@hookimpl
def werk_state_move(adapter: LlamaCppAdapter, work: MoveWork) -> MoveOutput:
    raise WerkError(ErrorCode.UNSUPPORTED, "llama.cpp named states live on disk only; ram/vram tiers are unsupported")


@hookimpl
def werk_count_tokens(adapter: LlamaCppAdapter, request: ChatRequest) -> int:
    # with werk.reasoning: the body the chat sends, thinking switch and budget included
    return adapter.count_tokens(reasoning.counted_request(adapter, request))


@hookimpl
def werk_chat_limits(adapter: LlamaCppAdapter, model: str | None) -> ChatLimits:
    return adapter.chat_limits(model)


@hookimpl
def werk_reasoning_profile(adapter: LlamaCppAdapter, model: str | None, max_output_tokens: int) -> ReasoningProfile:
    # Tiers only where the running server's budget control is verified (werk_llamacpp.reasoning).
    return reasoning.reasoning_profile(adapter, model or adapter.manifest.name, max_output_tokens)


def _proxy(adapter: LlamaCppAdapter, path: str, body: JsonObject) -> InferenceResponse:
    """Forward ``body`` (already without ``werk``) to the live llama-server, on an ordinary slot
    chosen and held by :func:`.slots.forward_ordinary` (never the client's, never the state slot)."""
    return forward_ordinary(adapter, path, body)


@hookimpl
def werk_chat_completion(adapter: LlamaCppAdapter, request: JsonObject) -> InferenceResponse:
    # a resolved werk.reasoning tier becomes llama-server's thinking switch and budget
    return _proxy(adapter, "/v1/chat/completions", reasoning.forwarded_chat(request))


@hookimpl
def werk_text_completion(adapter: LlamaCppAdapter, request: JsonObject) -> InferenceResponse:
    return _proxy(adapter, "/v1/completions", {k: v for k, v in request.items() if k != "werk"})


@hookimpl
def werk_session_snapshots(adapter: LlamaCppAdapter, model_id: str) -> LlamaSessionSnapshots:
    return session_snapshots(adapter, model_id)


@hookimpl
def werk_workers(adapter: LlamaCppAdapter) -> list[WorkerObservation]:
    return adapter.workers()


@hookimpl
def werk_deployment_plan(adapter: LlamaCppAdapter) -> DeploymentPlan | None:
    return adapter.plan()

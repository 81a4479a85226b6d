"""werk-llamacpp's plugin module: the llama.cpp backend for Werk host (entry point ``llamacpp``).

It holds the collected hooks only: the adapter factory, the doctor checks and the ``werk
llamacpp`` commands. Every operation (prefill, decode, chat, counting, ...) is a method of
:class:`~werk_llamacpp.adapter.LlamaCppAdapter` marked ``@hookimpl(specname=...)``; the host
registers each adapter it creates, so its operations reach that adapter's own methods
(docs/plugin-kit.md).
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
    WorkerObservation,
    hookimpl,
)

from . import doctor
from .adapter import LlamaCppAdapter, accepts, create_adapter
from .capabilities import REPORTED_CAPABILITIES
from .cli import werk_cli_commands as werk_cli_commands  # `werk llamacpp`; `werk` imports only .cli
from .core import BACKEND_ID
from .options import validate_options
from .session import LlamaSessionSnapshots


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
    return adapter.state_move(work)


@hookimpl
def werk_count_tokens(adapter: LlamaCppAdapter, request: ChatRequest) -> int:
    return adapter.count_request(request)


@hookimpl
def werk_chat_limits(adapter: LlamaCppAdapter, model: str | None) -> ChatLimits:
    return adapter.chat_limits(model)


@hookimpl
def werk_reasoning_profile(adapter: LlamaCppAdapter, model: str | None, max_output_tokens: int) -> ReasoningProfile:
    return adapter.reasoning_profile(model, max_output_tokens)


@hookimpl
def werk_chat_completion(adapter: LlamaCppAdapter, request: JsonObject) -> InferenceResponse:
    return adapter.chat_completion(request)


@hookimpl
def werk_text_completion(adapter: LlamaCppAdapter, request: JsonObject) -> InferenceResponse:
    return adapter.text_completion(request)


@hookimpl
def werk_session_snapshots(adapter: LlamaCppAdapter, model_id: str) -> LlamaSessionSnapshots:
    return adapter.session_snapshots(model_id)


@hookimpl
def werk_workers(adapter: LlamaCppAdapter) -> list[WorkerObservation]:
    return adapter.workers()


@hookimpl
def werk_deployment_plan(adapter: LlamaCppAdapter) -> DeploymentPlan | None:
    return adapter.plan()

"""werk-omlx's hook implementations: MLX checkpoints with MoE expert offload for Werk host.

The host dispatches operation hooks only to the plugin that owns the adapter
(docs/plugin-hooks.md, "Dispatch rules"), so every ``adapter`` here is an :class:`OmlxAdapter`
this plugin created. Named state, snapshots, restores, tier moves and split prefill/decode are
not implemented: the host answers them ``unsupported``.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import JsonValue

from werk_host.plugin import (
    AdapterFactory,
    CapabilityId,
    CapabilityReport,
    ChatLimits,
    ChatRequest,
    DoctorCheck,
    ExpertActionRequest,
    ExpertActionResult,
    ExpertListQuery,
    ExpertPage,
    HostConfig,
    InferenceResponse,
    JsonObject,
    ReasoningProfile,
    WerkError,
    WorkerObservation,
    hookimpl,
)
from werk_host.plugin.reasoning import unsupported_profile

from . import doctor
from .adapter import BACKEND_ID, REPORTED_CAPABILITIES, OmlxAdapter, Settings, accepts, create_adapter


@hookimpl
def werk_adapter_factories(config: HostConfig) -> list[AdapterFactory]:
    return [
        AdapterFactory(
            BACKEND_ID,
            accepts,
            create_adapter,
            "MLX checkpoints in a Werk-owned mlx-lm worker with MoE expert offload (or omlx serve on Apple silicon)",
            capabilities=REPORTED_CAPABILITIES,
            validate_options=_validate_options,
        )
    ]


def _validate_options(options: Mapping[str, JsonValue]) -> None:
    """An instance's profile options, checked when ``werk serve`` starts by the rules the worker
    settings apply (docs/plugin-kit.md, "Options")."""
    try:
        Settings.parse(dict(options))
    except WerkError as err:
        raise ValueError(err.message) from err


@hookimpl
def werk_doctor_checks(config: HostConfig) -> list[DoctorCheck]:
    return doctor.checks(config)


@hookimpl
def werk_capabilities(adapter: OmlxAdapter) -> dict[CapabilityId, CapabilityReport]:
    return adapter.capabilities()


@hookimpl
def werk_count_tokens(adapter: OmlxAdapter, request: ChatRequest) -> int:
    return adapter.count_tokens(request)


@hookimpl
def werk_request_options(adapter: OmlxAdapter, name: str, options: JsonObject) -> JsonObject | None:
    return adapter.request_options(name, options)


@hookimpl
def werk_chat_limits(adapter: OmlxAdapter, model: str | None) -> ChatLimits:
    return adapter.chat_limits(model)


@hookimpl
def werk_reasoning_profile(adapter: OmlxAdapter, model: str | None, max_output_tokens: int) -> ReasoningProfile:
    # No reasoning budget control has been verified for MLX: report that truthfully.
    return unsupported_profile(model or adapter.manifest.name, BACKEND_ID)


@hookimpl
def werk_chat_completion(adapter: OmlxAdapter, request: JsonObject) -> InferenceResponse:
    return adapter.relay("/v1/chat/completions", request)


@hookimpl
def werk_text_completion(adapter: OmlxAdapter, request: JsonObject) -> InferenceResponse:
    return adapter.relay("/v1/completions", request)


@hookimpl
def werk_workers(adapter: OmlxAdapter) -> list[WorkerObservation]:
    return adapter.workers()


@hookimpl
def werk_list_experts(adapter: OmlxAdapter, query: ExpertListQuery) -> ExpertPage:
    return adapter.list_experts(query)


@hookimpl
def werk_expert_action(adapter: OmlxAdapter, request: ExpertActionRequest) -> ExpertActionResult:
    return adapter.expert_action(request)

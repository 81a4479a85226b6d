"""werk-vllm's hook implementations: the vLLM backend for Werk host.

The host dispatches operation hooks only to the plugin that owns the adapter
(docs/plugin-hooks.md, "Dispatch rules"), so every ``adapter`` here is a :class:`VllmAdapter`
this plugin created. vLLM offers no named state, snapshot, restore, tier or expert control:
those hooks are deliberately not implemented (the host answers them ``unsupported``).
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
    DeploymentPlan,
    DoctorCheck,
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
from .adapter import BACKEND_ID, REPORTED_CAPABILITIES, VllmAdapter, accepts, create_adapter
from .launch import parse_options


@hookimpl
def werk_adapter_factories(config: HostConfig) -> list[AdapterFactory]:
    return [
        AdapterFactory(
            BACKEND_ID,
            accepts,
            create_adapter,
            "vLLM: a Werk-started vllm serve (Hugging Face model directory) or a remote endpoint",
            capabilities=REPORTED_CAPABILITIES,
            validate_options=_validate_options,
        )
    ]


def _validate_options(options: Mapping[str, JsonValue]) -> None:
    """An instance's profile options (``endpoint`` and ``api_key_env`` included), checked when
    ``werk serve`` starts by the rules the adapter applies (docs/plugin-kit.md, "Options")."""
    try:
        parse_options(options)
    except WerkError as err:
        raise ValueError(err.message) from err


@hookimpl
def werk_doctor_checks(config: HostConfig) -> list[DoctorCheck]:
    return doctor.checks(config)


@hookimpl
def werk_capabilities(adapter: VllmAdapter) -> dict[CapabilityId, CapabilityReport]:
    return adapter.capabilities()


@hookimpl
def werk_count_tokens(adapter: VllmAdapter, request: ChatRequest) -> int:
    return adapter.count_tokens(request)


@hookimpl
def werk_chat_limits(adapter: VllmAdapter, model: str | None) -> ChatLimits:
    return adapter.chat_limits(model)


@hookimpl
def werk_reasoning_profile(adapter: VllmAdapter, model: str | None, max_output_tokens: int) -> ReasoningProfile:
    # No reasoning budget control has been verified for vLLM: report that truthfully.
    return unsupported_profile(model or adapter.served_name, BACKEND_ID)


@hookimpl
def werk_chat_completion(adapter: VllmAdapter, request: JsonObject) -> InferenceResponse:
    return adapter.relay("/v1/chat/completions", request)


@hookimpl
def werk_text_completion(adapter: VllmAdapter, request: JsonObject) -> InferenceResponse:
    return adapter.relay("/v1/completions", request)


@hookimpl
def werk_workers(adapter: VllmAdapter) -> list[WorkerObservation]:
    return adapter.workers()


@hookimpl
def werk_deployment_plan(adapter: VllmAdapter) -> DeploymentPlan | None:
    return adapter.plan()

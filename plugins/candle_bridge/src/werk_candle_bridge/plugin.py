"""werk-candle-bridge's hook implementations: the in-process mistral.rs (Candle) backend.

The host dispatches operation hooks only to the plugin that owns the adapter
(docs/plugin-hooks.md, "Dispatch rules"), so every ``adapter`` here is a :class:`CandleAdapter`
this plugin created. The engine keeps no named state: prefill, decode, snapshot, restore, tier
and expert hooks are deliberately not implemented (the host answers them ``unsupported``).
Importing this module never imports the engine, so the plugin loads on every platform.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import JsonValue

from werk_host import hookimpl
from werk_host.backend import AdapterFactory, CapabilityReport, DoctorCheck, InferenceResponse, JsonObject
from werk_host.config import HostConfig
from werk_host.errors import WerkError
from werk_host.protocol import (
    CapabilityId,
    ChatLimits,
    ChatRequest,
    DeploymentPlan,
    ReasoningProfile,
    WorkerObservation,
)
from werk_host.service.reasoning import unsupported_profile

from . import doctor
from .adapter import (
    BACKEND_ID,
    REPORTED_CAPABILITIES,
    CandleAdapter,
    accepts,
    check_options,
    create_adapter,
)


@hookimpl
def werk_adapter_factories(config: HostConfig) -> list[AdapterFactory]:
    return [
        AdapterFactory(
            BACKEND_ID,
            accepts,
            create_adapter,
            "in-process mistral.rs (Candle) engine for GGUF models",
            capabilities=REPORTED_CAPABILITIES,
            validate_options=_validate_options,
        )
    ]


def _validate_options(options: Mapping[str, JsonValue]) -> None:
    """An instance's profile options, checked when ``werk serve`` starts by the rules the engine
    settings apply (docs/plugin-kit.md, "Options")."""
    try:
        check_options(options)
    except WerkError as err:
        raise ValueError(err.message) from err


@hookimpl
def werk_doctor_checks(config: HostConfig) -> list[DoctorCheck]:
    return doctor.checks(config)


@hookimpl
def werk_capabilities(adapter: CandleAdapter) -> dict[CapabilityId, CapabilityReport]:
    return adapter.capabilities()


@hookimpl
def werk_count_tokens(adapter: CandleAdapter, request: ChatRequest) -> int:
    return adapter.count_tokens(request)


@hookimpl
def werk_chat_limits(adapter: CandleAdapter, model: str | None) -> ChatLimits:
    return adapter.chat_limits(model)


@hookimpl
def werk_reasoning_profile(adapter: CandleAdapter, model: str | None, max_output_tokens: int) -> ReasoningProfile:
    # No reasoning budget control has been verified for this engine: report that truthfully.
    return unsupported_profile(model or adapter.manifest.name, BACKEND_ID)


@hookimpl
def werk_chat_completion(adapter: CandleAdapter, request: JsonObject) -> InferenceResponse:
    return adapter.chat(request)


@hookimpl
def werk_text_completion(adapter: CandleAdapter, request: JsonObject) -> InferenceResponse:
    return adapter.complete(request)


@hookimpl
def werk_workers(adapter: CandleAdapter) -> list[WorkerObservation]:
    return adapter.workers()


@hookimpl
def werk_deployment_plan(adapter: CandleAdapter) -> DeploymentPlan | None:
    return adapter.plan()

"""werk-template's hook implementations: the entry point ``werk: template`` names this module.

The host calls operation hooks only for adapters this plugin created, so ``adapter`` is always
an :class:`EchoAdapter`. Hooks left out (prefill, decode, states, experts, …) are reported
``unsupported`` by the host.
"""

from __future__ import annotations

from werk_host import hookimpl
from werk_host.backend import AdapterFactory, CapabilityReport, DoctorCheck, InferenceResponse, JsonObject
from werk_host.config import HostConfig
from werk_host.protocol import CapabilityId, CapabilityStatus, ChatLimits, ChatRequest

from .adapter import BACKEND_ID, PLUGIN_NAME, EchoAdapter, accepts, create_adapter, message_tokens

REPORTED = {
    CapabilityId.MODEL_RESIDENCY: "the echo model lives in the werk serve process",
    CapabilityId.TOKEN_COUNT: "exact: words plus two per message, as the usage reports",
    CapabilityId.ADMISSION: "from the exact token count",
    CapabilityId.CHAT_LIMITS: "a fixed 4,096-token context",
}


@hookimpl
def werk_adapter_factories(config: HostConfig) -> list[AdapterFactory]:
    return [AdapterFactory(BACKEND_ID, accepts, create_adapter, "in-process echo", tuple(REPORTED))]


# COPIERS: replace this with checks of what your engine needs here (an executable found and its
# `--version`, a native module importable, the platform), each with the fix when it is missing.
# Keep it cheap: no model loads, no process but bounded --version/--help probes
# (docs/plugin-kit.md, "Doctor checks").
@hookimpl
def werk_doctor_checks(config: HostConfig) -> list[DoctorCheck]:
    return [DoctorCheck(f"{PLUGIN_NAME}.engine", "ok", "the echo engine runs in the werk process; nothing to install")]


@hookimpl
def werk_capabilities(adapter: EchoAdapter) -> dict[CapabilityId, CapabilityReport]:
    return {cap_id: CapabilityReport(CapabilityStatus.SUPPORTED, detail) for cap_id, detail in REPORTED.items()}


@hookimpl
def werk_count_tokens(adapter: EchoAdapter, request: ChatRequest) -> int:
    return message_tokens([m.model_dump(mode="json") for m in request.messages])


@hookimpl
def werk_chat_limits(adapter: EchoAdapter, model: str | None) -> ChatLimits:
    return adapter.limits(model)


@hookimpl
def werk_chat_completion(adapter: EchoAdapter, request: JsonObject) -> InferenceResponse:
    return adapter.complete(request)

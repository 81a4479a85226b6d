"""The adapter: one model an OpenAI-compatible server elsewhere serves, relayed as it streams.

Built on :mod:`werk_host.plugin.remote` alone (docs/plugin-kit.md, "Backends without local
files"): ``create`` parses the instance's options and probes the server once, and never fails
for a server that is down or refuses the key, so that each request gets the reason (a 503
naming it) instead of a failed start. Nothing runs locally: there is no process to own, and
the identity is the adapter's own generation, new whenever the instance starts again.
"""

from __future__ import annotations

import secrets

from werk_host.plugin import (
    CapabilityId,
    CapabilityReport,
    CapabilityStatus,
    ChatLimits,
    ErrorCode,
    HostConfig,
    InferenceResponse,
    JsonObject,
    ModelManifest,
    WerkError,
    hookimpl,
)
from werk_host.plugin.remote import Remote, remote_settings

BACKEND_ID = "openai_upstream"
REPORTED = {
    CapabilityId.MODEL_RESIDENCY: "from the last probe of the upstream (GET /models) or request",
    CapabilityId.CHAT_LIMITS: "unknown (null): an OpenAI-compatible server does not publish them",
}


class UpstreamAdapter:
    """A model served by a remote OpenAI-compatible server."""

    backend = BACKEND_ID

    def __init__(self, manifest: ModelManifest, remote: Remote) -> None:
        self.manifest = manifest
        self.remote = remote
        self.instance_id = f"{BACKEND_ID}:{manifest.name}"
        #: the upstream's own process is invisible from here: one generation per adapter
        self.generation = secrets.token_hex(8)

    def identity(self) -> str:
        return f"{self.instance_id}#{self.generation}"

    def close(self) -> None:
        self.remote.close()

    @hookimpl(specname="werk_capabilities")
    def capabilities(self) -> dict[CapabilityId, CapabilityReport]:
        last = self.remote.last
        if last is not None and last.ok:
            residency = CapabilityReport(
                CapabilityStatus.EXTERNALLY_MANAGED, "the upstream holds the model; it answered its last probe"
            )
        else:
            why = self.remote.error(last).message if last is not None else "the upstream was not probed yet"
            residency = CapabilityReport(CapabilityStatus.UNAVAILABLE, why)
        limits = CapabilityReport(CapabilityStatus.SUPPORTED, REPORTED[CapabilityId.CHAT_LIMITS])
        return {CapabilityId.MODEL_RESIDENCY: residency, CapabilityId.CHAT_LIMITS: limits}

    @hookimpl(specname="werk_chat_limits")
    def chat_limits(self, model: str | None) -> ChatLimits:
        return ChatLimits(
            model=model or self.manifest.name,
            context_tokens=None,
            max_output_tokens=None,
            max_concurrent_requests=None,
            engine_queues=True,  # the upstream has its own scheduler and admission
        )

    def _relay(self, path: str, request: JsonObject) -> InferenceResponse:
        self.remote.ready(self.manifest.name)  # the last failure, with its reason, or nothing
        body = {k: v for k, v in request.items() if k != "werk"}  # Werk's member, not OpenAI's
        body["model"] = self.manifest.name  # the name the upstream serves (the profile's model)
        return self.remote.forward(path, body)

    @hookimpl(specname="werk_chat_completion")
    def chat_completion(self, request: JsonObject) -> InferenceResponse:
        return self._relay("/chat/completions", request)

    @hookimpl(specname="werk_text_completion")
    def text_completion(self, request: JsonObject) -> InferenceResponse:
        return self._relay("/completions", request)


def accepts(manifest: ModelManifest | None) -> bool:
    """Only models pinned to this backend: a remote instance's ``backend = "openai_upstream"``."""
    return manifest is not None and manifest.backend == BACKEND_ID


def create_adapter(config: HostConfig, manifest: ModelManifest | None) -> UpstreamAdapter:
    if manifest is None:
        raise WerkError(ErrorCode.INVALID_REQUEST, "the openai_upstream backend needs a model")
    try:
        settings = remote_settings(config.backend_options.get(BACKEND_ID, {}))
        label = f"the upstream for model {manifest.name}"
        remote = Remote(settings, label=label, bounds=config.backend_bounds)
    except ValueError as err:
        raise WerkError(ErrorCode.INVALID_REQUEST, f"backend options of {BACKEND_ID}: {err}") from err
    remote.probe(manifest.name)  # evidence for the capabilities; a failure is each request's reason
    return UpstreamAdapter(manifest, remote)

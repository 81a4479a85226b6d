"""The candle adapter: a registered GGUF model served in process by mistral.rs.

One :class:`CandleAdapter` per instance; the loaded model behind it is shared through
:data:`werk_candle_bridge.residency.POOL` (one per manifest identity and engine settings),
loaded on first use and unloaded when the last adapter closes. What it reports is evidence
read at the time (docs/candle.md, "Capabilities"):

* ``runtime.model_residency``: ``supported`` while the model is loaded, ``unavailable`` before
  (it loads on first use) or after a failed load (with the reason);
* ``runtime.state.prefix_cache``: see :mod:`werk_candle_bridge.prefix`;
* ``api.chat.token_count`` / ``api.chat.admission``: exact counts (the engine tokenizes the very
  prompt Werk renders), ``unavailable`` after a failed load;
* ``api.chat.limits``: ``max_sequence_length()`` of the loaded engine (before loading, the GGUF's
  ``<architecture>.context_length``, the value the engine reads), the manifest's output ceiling,
  ``max_seqs`` as concurrency;
* ``api.chat.reasoning``: answered truthfully (no verified reasoning control).

Each operation is one method marked ``@hookimpl(specname=...)``: the host registers the adapter
with its plugin manager, so the method is the hook (docs/plugin-hooks.md). The engine keeps no
named state: prefill, decode, snapshots, tiers and experts are not implemented, so the host
answers them ``unsupported`` (501). Where the engine is not installed
(no mistralrs wheel for the platform) every reported id is ``unavailable`` with that reason.
"""

from __future__ import annotations

import logging
import os

from pydantic import JsonValue

from werk_host.plugin import (
    CapabilityId,
    CapabilityReport,
    CapabilityStatus,
    ChatLimits,
    ChatRequest,
    DeploymentPlan,
    EndpointKind,
    ErrorCode,
    HostConfig,
    InferenceResponse,
    JsonObject,
    ModelManifest,
    ReasoningProfile,
    ReusePolicy,
    WerkError,
    WorkerObservation,
    hookimpl,
)
from werk_host.plugin.reasoning import unsupported_profile

from .backend import BACKEND_ID, CHAT_CAPABILITIES, PLUGIN_NAME, _option_int, check_options
from .backend import REPORTED_CAPABILITIES as REPORTED_CAPABILITIES
from .backend import accepts as accepts
from .engine import EngineFailure, EngineSettings, missing_engine_reason
from .generation import run
from .residency import POOL, SharedModel
from .wire import parse_chat, parse_completion

__all__ = ["BACKEND_ID", "PLUGIN_NAME", "REPORTED_CAPABILITIES", "CandleAdapter", "accepts", "create_adapter"]

log = logging.getLogger(__name__)

#: The engine's own default prefix-cache size, used when ``--persistence`` enables reuse.
PERSISTENT_PREFIX_CACHE_N = 16


def engine_settings(config: HostConfig) -> EngineSettings:
    """The engine settings of ``config``: ``max_seqs`` (default 1) and ``prefix_cache_n``
    (default 0; :data:`PERSISTENT_PREFIX_CACHE_N` under ``--persistence`` with reuse enabled)."""
    options = dict(config.backend_options.get(PLUGIN_NAME, {}))
    check_options(options)
    persistence = config.persistence
    reuse = persistence is not None and persistence.reuse is not ReusePolicy.DISABLED
    prefix = _option_int(options, "prefix_cache_n", 0)
    return EngineSettings(
        max_seqs=_option_int(options, "max_seqs", 1) or 1,
        prefix_cache_n=prefix if prefix is not None else (PERSISTENT_PREFIX_CACHE_N if reuse else 0),
    )


class CandleAdapter:
    """Adapter for one registered GGUF model on the in-process engine (module docstring)."""

    backend = BACKEND_ID

    def __init__(self, manifest: ModelManifest, shared: SharedModel) -> None:
        self.manifest = manifest
        self.shared = shared
        self.instance_id = f"{BACKEND_ID}:{manifest.name}"
        self.closed = False

    # -- identity and lifecycle ------------------------------------------------------------------
    def identity(self) -> str:
        """Changes with every load of the model (a new engine generation)."""
        engine = self.shared.loaded()
        return f"{self.instance_id}#{engine.generation if engine is not None else 'none'}"

    def close(self) -> None:
        """Release the shared model; the last adapter's release unloads it. Idempotent."""
        if not self.closed:
            self.closed = True
            POOL.release(self.shared)

    def _shared(self) -> SharedModel:
        if self.closed:
            raise WerkError(ErrorCode.UNAVAILABLE, "the candle adapter is shut down", retryable=True)
        return self.shared

    # -- evidence --------------------------------------------------------------------------------
    @hookimpl(specname="werk_capabilities")
    def capabilities(self) -> dict[CapabilityId, CapabilityReport]:
        missing = missing_engine_reason()
        if missing is not None:
            return {cap_id: CapabilityReport(CapabilityStatus.UNAVAILABLE, missing) for cap_id in REPORTED_CAPABILITIES}
        shared = self.shared
        loaded = shared.loaded() is not None
        failure = shared.failure
        reports: dict[CapabilityId, CapabilityReport] = {}
        if loaded:
            reports[CapabilityId.MODEL_RESIDENCY] = CapabilityReport(
                CapabilityStatus.SUPPORTED, "the weights stay loaded in the werk serve process until the instance stops"
            )
        else:
            why = failure or "the model is not loaded yet; the first request that needs it loads it"
            reports[CapabilityId.MODEL_RESIDENCY] = CapabilityReport(CapabilityStatus.UNAVAILABLE, why)
        reports[CapabilityId.PREFIX_CACHE] = shared.prefix.report(loaded)
        for cap_id, detail in CHAT_CAPABILITIES:
            if failure is not None and not loaded:
                reports[cap_id] = CapabilityReport(CapabilityStatus.UNAVAILABLE, failure)
            else:
                reports[cap_id] = CapabilityReport(CapabilityStatus.SUPPORTED, detail)
        reports[CapabilityId.CHAT_LIMITS] = CapabilityReport(
            CapabilityStatus.SUPPORTED,
            "context from the engine (or the GGUF header before loading), output from the manifest",
        )
        reports[CapabilityId.REASONING] = CapabilityReport(
            CapabilityStatus.SUPPORTED, "answers truthfully: no reasoning budget control is verified for this engine"
        )
        return reports

    def context_tokens(self) -> int | None:
        engine = self.shared.loaded()
        if engine is not None:
            return engine.max_sequence_length
        try:
            return self.shared.metadata().context_length
        except WerkError:
            return None

    # -- chat planning ---------------------------------------------------------------------------
    @hookimpl(specname="werk_chat_limits")
    def chat_limits(self, model: str | None) -> ChatLimits:
        context = self.context_tokens()
        ceilings = [c for c in (self.manifest.output_ceiling(), context - 1 if context else None) if c]
        return ChatLimits(
            model=model or self.manifest.name,
            context_tokens=context,
            max_output_tokens=min(ceilings) if ceilings else None,
            max_concurrent_requests=self.shared.settings.max_seqs,
        )

    @hookimpl(specname="werk_count_tokens")
    def count_tokens(self, request: ChatRequest) -> int:
        """The ``prompt_tokens`` a chat completion of ``request`` reports (it loads the model)."""
        body: dict[str, JsonValue] = request.model_dump(mode="json", exclude_none=True, exclude={"werk"})
        job = parse_chat(body, self.manifest.output_ceiling())
        shared = self._shared()
        engine = shared.engine()
        prompt = shared.renderer().render(job.messages)
        try:
            return len(engine.tokenize(prompt))
        except EngineFailure as err:
            log.error("candle: counting tokens for model %s failed: %s", shared.name, err.detail)
            raise WerkError(
                ErrorCode.UNAVAILABLE, "the candle engine could not count this request", retryable=True
            ) from err

    @hookimpl(specname="werk_reasoning_profile")
    def reasoning_profile(self, model: str | None) -> ReasoningProfile:
        """No reasoning budget control has been verified for this engine: said truthfully."""
        return unsupported_profile(model or self.manifest.name, BACKEND_ID)

    # -- inference -------------------------------------------------------------------------------
    @hookimpl(specname="werk_chat_completion")
    def chat(self, request: JsonObject) -> InferenceResponse:
        ceiling = self.manifest.output_ceiling()
        return run(self._shared(), parse_chat(request, ceiling), ceiling)

    @hookimpl(specname="werk_text_completion")
    def complete(self, request: JsonObject) -> InferenceResponse:
        ceiling = self.manifest.output_ceiling()
        return run(self._shared(), parse_completion(request, ceiling), ceiling)

    # -- observation -----------------------------------------------------------------------------
    @hookimpl(specname="werk_workers")
    def workers(self) -> list[WorkerObservation]:
        """The loaded model as a worker of the ``werk serve`` process (none before loading)."""
        engine = self.shared.loaded()
        if engine is None:
            return []
        generating, waiting = self.shared.traffic()
        return [
            WorkerObservation(
                model=self.manifest.name,
                backend=BACKEND_ID,
                pid=os.getpid(),
                state="running",
                slots=engine.settings.max_seqs,
                context_per_request_tokens=engine.max_sequence_length,
                context_capacity_tokens=None,
                requests_running=generating,
                requests_waiting=waiting,
                kv_cache_usage=None,
                prefix_cache_hit_rate=self.shared.prefix.hit_rate(),
            )
        ]

    @hookimpl(specname="werk_deployment_plan")
    def plan(self) -> DeploymentPlan | None:
        """The loaded engine's settings (``None`` before loading). The device is not reported:
        the engine does not say where it placed the weights."""
        engine = self.shared.loaded()
        if engine is None:
            return None
        return DeploymentPlan(
            endpoint=EndpointKind.LOCAL,
            arguments=engine.settings.arguments(),
            threads=None,
            parallel_slots=engine.settings.max_seqs,
            context_per_slot=engine.max_sequence_length,
            device=None,
        )


def create_adapter(config: HostConfig, manifest: ModelManifest | None) -> CandleAdapter:
    """An adapter for ``manifest``; nothing is loaded until a request needs the model."""
    if manifest is None:
        raise WerkError(ErrorCode.INVALID_REQUEST, "the candle backend needs a model")
    if len(manifest.files) != 1:
        raise WerkError(ErrorCode.INVALID_REQUEST, "a candle model is one GGUF file")
    settings = engine_settings(config)
    work_dir = config.home / "backends" / "candle"
    return CandleAdapter(manifest, POOL.acquire(manifest, settings, work_dir))

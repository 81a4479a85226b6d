"""Chat planning: token counts, admission, limits and reasoning profiles, per model or alias.

``model`` on a planning request names an instance id, a model name served by instances, or an
alias (docs/deployments.md, "Routing"); without it the request scope's instance answers (the
``X-Werk-Deployment`` header's, else the default). A replica is used through
:meth:`RequestScope.on`, so what it starts stays in flight until the request ends. Planning never advances an alias's
round-robin. For an alias (docs/protocol.md, "Chat planning"):

* limits are the minimum across replicas, and one replica with an unknown value makes that
  value unknown;
* reasoning profiles must agree across replicas, otherwise the alias reports none (select an
  instance id instead);
* token counting and admission use one replica.

Limits and reasoning are discovery: they never start a cold instance, which reports unknown
limits and no reasoning profile. Counting and admission use the instance, starting it.
"""

from __future__ import annotations

from collections.abc import Sequence

from werk_host.deployments.instances import Instance
from werk_host.errors import ErrorCode, WerkError
from werk_host.hooks import BackendHooks, needed
from werk_host.protocol import (
    Admission,
    CapabilityId,
    CapabilityStatus,
    ChatLimits,
    ChatRequest,
    ReasoningProfile,
    TokenCount,
)
from werk_host.seam import Adapter
from werk_host.service.admission import estimate_input_tokens
from werk_host.service.capabilities import CapabilityResolver
from werk_host.service.fleet import Fleet
from werk_host.service.policy import gate
from werk_host.service.reasoning import resolved_request, unsupported_profile
from werk_host.service.scope import RequestScope, no_backend


def _minimum(values: Sequence[int | None]) -> int | None:
    return None if any(v is None for v in values) else min(v for v in values if v is not None)


class ChatPlanning:
    """The four ``/werk/v1/chat/*`` operations over the deployment set."""

    def __init__(self, fleet: Fleet, hooks: BackendHooks, resolver: CapabilityResolver) -> None:
        self.fleet = fleet
        self.hooks = hooks
        self.resolver = resolver

    # -- which instances a request names ----------------------------------------------------
    def _replicas(self, scope: RequestScope, model: str | None) -> tuple[Instance | None, ...]:
        deployments = self.fleet.deployments
        if model is None or deployments is None:
            if model is not None and model not in scope.model_ids():
                raise WerkError(ErrorCode.NOT_FOUND, "model is not installed on this server")
            return (scope.instance,)
        replicas = deployments.replicas(model)
        if not replicas:
            raise deployments.not_served(model)
        return replicas

    def _one(self, scope: RequestScope, model: str | None) -> RequestScope:
        """The request on the one instance ``model`` names (without advancing an alias);
        without ``model``, the scope itself (:meth:`_replicas` names only its instance)."""
        if model is None:
            return scope
        deployments = self.fleet.deployments
        if deployments is None:
            return scope.on(self._replicas(scope, model)[0])
        return scope.on(deployments.route(model, advance=False))

    @staticmethod
    def _name(scope: RequestScope) -> str:
        manifest = scope.model
        if manifest is None:
            raise WerkError(ErrorCode.NOT_FOUND, "no model is selected on this server")
        return manifest.name

    def _using(self, scope: RequestScope, cap_id: CapabilityId, what: str) -> Adapter:
        """The scope's adapter for an operation (started), gated on ``cap_id``."""
        adapter = scope.started()
        report = self.resolver.one(adapter, cap_id, scope.instance)
        if report.status is not CapabilityStatus.SUPPORTED:  # what gate() passes at once
            gate(cap_id, report.status, report.detail, False, probe_on_use=report.probe_on_use)
        if adapter is None:
            raise no_backend(what)
        return adapter

    def _discovering(self, scope: RequestScope, cap_id: CapabilityId) -> Adapter | None:
        """The scope's adapter for discovery (never started), gated on ``cap_id`` when it is
        ready; ``None`` when the instance is cold."""
        adapter = scope.adapter
        instance = scope.instance
        if adapter is None and instance is not None:
            return None  # cold: unknown limits, no profile
        report = self.resolver.one(adapter, cap_id, instance)
        gate(cap_id, report.status, report.detail, False, probe_on_use=report.probe_on_use)
        if adapter is None:
            raise WerkError(ErrorCode.UNSUPPORTED, f"{cap_id.value} is not supported: no backend adapter is active")
        return adapter

    def _resolved(self, adapter: Adapter, model: str, request: ChatRequest) -> ChatRequest:
        """``request`` as the counting hook receives it: ``werk.reasoning.tier`` resolved once
        (:func:`resolved_request`); it and backend members ``werk.<name>`` on a planning request
        fail exactly as on chat. Without ``werk`` there is nothing to validate or resolve."""
        if request.werk is None:
            return request
        self.hooks.request_options(adapter, request)
        if request.werk.reasoning is not None:
            limits = self.hooks.chat_limits(adapter, model)
            return resolved_request(self.hooks, adapter, request, limits)
        return request

    # -- operations ----------------------------------------------------------------------
    def count_tokens(self, scope: RequestScope, request: ChatRequest) -> TokenCount:
        on = self._one(scope, request.model)
        adapter = self._using(on, CapabilityId.TOKEN_COUNT, "token counting")
        model = self._name(on)
        resolved = request if request.werk is None else self._resolved(adapter, model, request)
        count = needed(self.hooks.count_tokens(adapter, resolved), "token counting", adapter)
        return TokenCount(model=request.model or model, input_tokens=count)

    def admission(self, scope: RequestScope, request: ChatRequest) -> Admission:
        limits = self.chat_limits(scope, request.model)
        on = self._one(scope, request.model)
        adapter = self._using(on, CapabilityId.ADMISSION, "admission")
        model = self._name(on)
        resolved = self._resolved(adapter, model, request)
        method = "native"
        count: int | None = None
        token_count = self.resolver.one(adapter, CapabilityId.TOKEN_COUNT, on.instance)
        if token_count.status is CapabilityStatus.SUPPORTED:
            try:
                count = self.hooks.count_tokens(adapter, resolved)
            except WerkError as err:
                if err.code not in (ErrorCode.UNSUPPORTED, ErrorCode.UNAVAILABLE):
                    raise
        if count is None:
            method, count = "estimate", estimate_input_tokens(request)
        return Admission(
            model=request.model or model,
            input_tokens=count,
            max_output_tokens=min(request.requested_output_tokens(), limits.max_output_tokens or 1 << 31),
            context_tokens=limits.context_tokens,
            token_count_method=method,
        )

    def chat_limits(self, scope: RequestScope, model: str | None) -> ChatLimits:
        found: list[ChatLimits] = []
        for replica in self._replicas(scope, model):
            on = scope.on(replica)
            adapter = self._discovering(on, CapabilityId.CHAT_LIMITS)
            name = self._name(on)
            if adapter is None:
                found.append(
                    ChatLimits(model=name, context_tokens=None, max_output_tokens=None, max_concurrent_requests=None)
                )
            else:
                found.append(needed(self.hooks.chat_limits(adapter, name), "chat limits", adapter))
        if len(found) == 1:
            return found[0] if model is None else found[0].model_copy(update={"model": model})
        return ChatLimits(
            model=model if model is not None else self._name(scope),
            context_tokens=_minimum([f.context_tokens for f in found]),
            max_output_tokens=_minimum([f.max_output_tokens for f in found]),
            max_concurrent_requests=_minimum([f.max_concurrent_requests for f in found]),
            engine_queues=all(f.engine_queues for f in found),
        )

    def reasoning(self, scope: RequestScope, model: str | None, max_output_tokens: int) -> ReasoningProfile:
        found: list[ReasoningProfile] = []
        for replica in self._replicas(scope, model):
            on = scope.on(replica)
            adapter = self._discovering(on, CapabilityId.REASONING)
            name = self._name(on)
            backend = replica.backend if replica is not None else None
            if adapter is None:
                found.append(unsupported_profile(name, backend))
            else:
                profile = self.hooks.reasoning_profile(adapter, name, max_output_tokens)
                found.append(needed(profile, "reasoning profiles", adapter))
        if len(found) == 1:
            return found[0] if model is None else found[0].model_copy(update={"model": model})
        first = found[0].model_copy(update={"model": model})
        if all(f.model_copy(update={"model": model}) == first for f in found):
            return first
        return unsupported_profile(model, first.backend)

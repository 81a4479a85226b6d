"""Werk-owned reasoning budget tiers and the ``werk.reasoning.tier`` request option.

The resolver follows the protocol reference: the effective reasoning budget is the smaller
of the launch budget (negative = unlimited) and the output limit minus a 512-token answer
reserve, with output conservatively limited to context minus 512. A tier is available when
its budget fits. A named launch effort is kept or reduced to fit; otherwise an enabled
default is the highest available tier, and a disabled launch default stays ``none``.
"""

from __future__ import annotations

from werk_host.errors import ErrorCode, WerkError
from werk_host.hooks import BackendHooks
from werk_host.protocol import (
    ChatLimits,
    ChatRequest,
    ReasoningLimits,
    ReasoningProfile,
    ReasoningTier,
    ReasoningTierId,
)
from werk_host.protocol.chat import ReasoningSelection
from werk_host.seam import Adapter, JsonObject

ANSWER_RESERVE_TOKENS = 512
TIER_BUDGETS: tuple[tuple[ReasoningTierId, str, int], ...] = (
    (ReasoningTierId.NONE, "Off", 0),
    (ReasoningTierId.LOW, "Low", 512),
    (ReasoningTierId.MEDIUM, "Medium", 1024),
    (ReasoningTierId.HIGH, "High", 2048),
    (ReasoningTierId.MAX, "Max", 4096),
    (ReasoningTierId.ULTRA, "Ultra", 8192),
)
_TIER_TOKENS = {tier_id: tokens for tier_id, _, tokens in TIER_BUDGETS}


def unsupported_profile(model: str | None, backend: str | None) -> ReasoningProfile:
    return ReasoningProfile(
        model=model,
        backend=backend,
        supported=False,
        source=None,
        default_tier=None,
        default_adjusted_to_limits=False,
        limits=None,
        tiers=[],
    )


def budget_profile(
    *,
    model: str,
    backend: str,
    context_tokens: int | None,
    output_tokens: int,
    launch_budget: int,
    thinking_enabled: bool,
    launch_effort: ReasoningTierId | None = None,
) -> ReasoningProfile:
    """The tier profile of a runtime with verified budget control (see module docstring)."""
    output = output_tokens
    if context_tokens is not None:
        output = min(output, max(context_tokens - ANSWER_RESERVE_TOKENS, 0))
    budget = max(output - ANSWER_RESERVE_TOKENS, 0)
    if launch_budget >= 0:
        budget = min(budget, launch_budget)
    tiers = [
        ReasoningTier(
            id=tier_id,
            label=label,
            available=tokens <= budget,
            reasoning_tokens=tokens,
            minimum_output_tokens=tokens + ANSWER_RESERVE_TOKENS if tokens else 1,
        )
        for tier_id, label, tokens in TIER_BUDGETS
    ]
    fitting = [t.id for t in tiers if t.available]
    if not thinking_enabled or launch_budget == 0:
        default, wanted = ReasoningTierId.NONE, ReasoningTierId.NONE
    else:
        ceiling = _TIER_TOKENS[launch_effort] if launch_effort is not None else launch_budget
        wanted = max((i for i, _, b in TIER_BUDGETS if ceiling < 0 or b <= ceiling), key=lambda i: _TIER_TOKENS[i])
        default = max((i for i in fitting if _TIER_TOKENS[i] <= _TIER_TOKENS[wanted]), key=lambda i: _TIER_TOKENS[i])
    return ReasoningProfile(
        model=model,
        backend=backend,
        supported=True,
        source="worker_launch_configuration",
        default_tier=default,
        default_adjusted_to_limits=default is not wanted,
        limits=ReasoningLimits(
            context_tokens=context_tokens,
            output_tokens=output,
            answer_reserve_tokens=ANSWER_RESERVE_TOKENS,
            reasoning_tokens=budget,
        ),
        tiers=tiers,
    )


def invalid_tier(message: str) -> WerkError:
    return WerkError(ErrorCode.INVALID_REQUEST, message, details={"openai_code": "invalid_reasoning_tier"})


def _resolution(
    hooks: BackendHooks, adapter: Adapter, request: ChatRequest, limits: ChatLimits | None
) -> JsonObject | None:
    """The resolved ``werk.reasoning`` of ``request`` (which has one): ``{"tier": ...,
    "resolved_budget_tokens": N}``, or ``None`` when ``"default"`` meets an unsupported runtime
    (the member is dropped, the native default kept). Unknown or unavailable tiers, conflicts
    with ``reasoning_effort`` and a client-sent ``resolved_budget_tokens`` are
    ``invalid_reasoning_tier``."""
    assert request.werk is not None and request.werk.reasoning is not None
    wanted = request.werk.reasoning.tier
    if request.werk.reasoning.resolved_budget_tokens is not None:
        raise invalid_tier("werk.reasoning.resolved_budget_tokens is set by the server; send only the tier")
    if request.reasoning_effort is not None:
        raise invalid_tier("werk.reasoning.tier cannot be combined with reasoning_effort")
    if wanted != "default" and wanted not in {t.value for t in ReasoningTierId}:
        raise invalid_tier(f"unknown reasoning tier {wanted!r}")
    profile = hooks.reasoning_profile(adapter, limits.model if limits else None, request.requested_output_tokens())
    if profile is None or not profile.supported:
        if wanted == "default":
            return None
        raise invalid_tier("this runtime has no verified reasoning profile; only 'default' is accepted")
    tier_id = profile.default_tier.value if wanted == "default" and profile.default_tier else wanted
    tier = next((t for t in profile.tiers if t.id.value == tier_id), None)
    if tier is None or not tier.available:
        raise invalid_tier(f"reasoning tier {tier_id!r} is not available for this request")
    return {"tier": tier.id.value, "resolved_budget_tokens": tier.reasoning_tokens}


def resolve_reasoning(
    hooks: BackendHooks, adapter: Adapter, body: JsonObject, request: ChatRequest, limits: ChatLimits | None
) -> tuple[JsonObject, ChatRequest]:
    """Resolve ``werk.reasoning.tier`` once for a chat body and its validated ``request``: the
    body to send (``werk.reasoning.resolved_budget_tokens`` for the adapter, or the member
    dropped when ``"default"`` meets an unsupported runtime, native default kept; other ``werk``
    members such as ``werk.omlx`` unchanged) and the request every hook that takes a chat
    request receives (``werk_count_tokens``), resolved alike (docs/plugin-kit.md). Errors as
    :func:`_resolution`."""
    if request.werk is None or request.werk.reasoning is None:
        return body, request
    resolved = _resolution(hooks, adapter, request, limits)
    werk = body.get("werk")
    others = {k: v for k, v in werk.items() if k != "reasoning"} if isinstance(werk, dict) else {}
    stripped = {k: v for k, v in body.items() if k != "werk"}  # other werk members (werk.omlx) are kept
    if resolved is None:
        body = {**stripped, "werk": others} if others else stripped
    else:
        body = {**stripped, "werk": {**others, "reasoning": resolved}}
    reasoning = ReasoningSelection.model_validate(resolved) if resolved is not None else None
    extension = request.werk.model_copy(update={"reasoning": reasoning})
    if reasoning is None and not extension.backend_options():
        return body, request.model_copy(update={"werk": None})
    return body, request.model_copy(update={"werk": extension})


def resolved_request(
    hooks: BackendHooks, adapter: Adapter, request: ChatRequest, limits: ChatLimits | None
) -> ChatRequest:
    """The request :func:`resolve_reasoning` hands the hooks (a planning request: no body)."""
    return resolve_reasoning(hooks, adapter, {}, request, limits)[1]

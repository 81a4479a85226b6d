"""Werk reasoning tiers on llama.cpp (docs/compat.md, "Reasoning tiers on llama.cpp").

A running llama-server has *verified budget control* when

* its executable's help advertises ``--reasoning-budget`` (the per-request
  ``reasoning_budget_tokens`` field belongs to the same feature), and
* the server itself shows a thinking switch in its chat template: the template ``/props``
  reports mentions ``enable_thinking``, and ``/apply-template`` renders one conversation
  differently with ``chat_template_kwargs: {"enable_thinking": true}`` and ``false``.

The launch default follows from the same renderings: the conversation rendered without
``chat_template_kwargs`` equals the ``true`` rendering (thinking on) or the ``false`` one (off,
e.g. ``--reasoning off``); a third rendering is no verified default and no profile. The launch
budget is the effective ``--reasoning-budget`` argument (last one wins, default ``-1``); a named
``--reasoning-effort`` that is a tier id is the launch effort. Evidence is gathered once per
llama-server generation, by rendering only (nothing is counted or generated); a server that does
not answer gives no profile and is asked again next time (:func:`thinking_control`).

With verified control, :func:`reasoning_profile` is the host resolver's budget profile
(:func:`werk_host.plugin.reasoning.budget_profile`) over the served per-request context and
output ceiling; otherwise it is unsupported. A chat body whose ``werk.reasoning`` the host
resolved (``resolved_budget_tokens``) is forwarded with the thinking switch and budget
llama-server reads per request (:func:`forwarded_chat`): ``chat_template_kwargs.enable_thinking``
(``false`` for a zero budget) and ``reasoning_budget_tokens``. The host resolves the tier once
per request and hands ``werk_count_tokens`` the request resolved alike, so counting renders
exactly that body (:func:`counted_request`) and the count equals the prompt the chat then sends;
this module never resolves a tier itself. A tier combined with the request's own thinking switch
or budget field is ``invalid_reasoning_tier``.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING

from werk_host.plugin import ChatRequest, JsonObject, ReasoningProfile, ReasoningTierId
from werk_host.plugin.reasoning import budget_profile, invalid_tier, unsupported_profile

from .core import BACKEND_ID
from .native import NativeError, NativeHTTPError
from .process import LlamaServerProcess, last_flag_value

if TYPE_CHECKING:
    from .adapter import LlamaCppAdapter

BUDGET_FLAG = "--reasoning-budget"
_EFFORT_FLAGS = ("--reasoning-effort",)
#: The template variable llama-server sets from ``chat_template_kwargs.enable_thinking``.
SWITCH = "enable_thinking"
#: Per-request fields of llama-server's ``/v1/chat/completions`` that set the thinking budget.
BUDGET_FIELDS = ("reasoning_budget_tokens", "thinking_budget_tokens")
#: The conversation rendered to find the switch.
_PROBE_MESSAGES = ({"role": "user", "content": "hello"},)
#: Seconds one rendering may take (the server answers from memory).
_RENDER_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class ThinkingControl:
    """Verified budget control of one llama-server generation (module docstring)."""

    thinking_enabled: bool
    launch_budget: int
    launch_effort: ReasoningTierId | None


_lock = threading.Lock()
#: Evidence per live process: its control, or ``None`` when it has none.
_verified: weakref.WeakKeyDictionary[LlamaServerProcess, ThinkingControl | None] = weakref.WeakKeyDictionary()


def _launch_budget(argv: list[str]) -> int | None:
    raw = last_flag_value(argv, (BUDGET_FLAG,))
    if raw is None:
        return -1
    try:
        value = int(raw)
    except ValueError:
        return None
    return value if value >= -1 else None


def _launch_effort(argv: list[str]) -> ReasoningTierId | None:
    raw = last_flag_value(argv, _EFFORT_FLAGS)
    return ReasoningTierId(raw) if raw in {t.value for t in ReasoningTierId} else None


def _observe(proc: LlamaServerProcess) -> ThinkingControl | None:
    """Gather the evidence from ``proc`` (raises :class:`NativeError` when it does not answer)."""
    if proc.binary is None or not proc.binary.advertises(BUDGET_FLAG):
        return None
    argv = proc.argv[1:]
    budget = _launch_budget(argv)
    if budget is None:
        return None
    client = proc.new_client(timeout=_RENDER_TIMEOUT_S)
    try:
        template = client.props().get("chat_template")
        if not isinstance(template, str) or SWITCH not in template:
            return None
        on = client.apply_template(_PROBE_MESSAGES, chat_template_kwargs={SWITCH: True})
        off = client.apply_template(_PROBE_MESSAGES, chat_template_kwargs={SWITCH: False})
        native = client.apply_template(_PROBE_MESSAGES)
    finally:
        client.close()
    if on == off or native not in (on, off):
        return None
    return ThinkingControl(native == on, budget, _launch_effort(argv))


def thinking_control(proc: LlamaServerProcess) -> ThinkingControl | None:
    """``proc``'s verified budget control, gathered once per process; ``None`` without it. A
    server that refuses a rendering has none; one that does not answer (or is busy loading)
    has none for now, and is asked again next time."""
    with _lock:
        if proc in _verified:
            return _verified[proc]
    try:
        control = _observe(proc)
    except NativeHTTPError as err:
        if err.status == 503:
            return None
        control = None
    except NativeError:
        return None
    with _lock:
        _verified[proc] = control
    return control


def reasoning_profile(adapter: LlamaCppAdapter, model: str, max_output_tokens: int) -> ReasoningProfile:
    """The tier profile of the running llama-server for an output allowance of
    ``max_output_tokens`` (bounded by the served output ceiling); unsupported when no process
    runs or its budget control is not verified."""
    proc = adapter.current()
    control = thinking_control(proc) if proc is not None else None
    if control is None:
        return unsupported_profile(model, BACKEND_ID)
    limits = adapter.chat_limits(model)
    output = max_output_tokens
    if limits.max_output_tokens is not None:
        output = min(output, limits.max_output_tokens)
    return budget_profile(
        model=model,
        backend=BACKEND_ID,
        context_tokens=limits.context_tokens,
        output_tokens=output,
        launch_budget=control.launch_budget,
        thinking_enabled=control.thinking_enabled,
        launch_effort=control.launch_effort,
    )


def with_budget(body: JsonObject, budget: int) -> JsonObject:
    """``body`` (without ``werk``) asking llama-server for a thinking budget of ``budget``
    tokens: the thinking switch (off for ``0``) and ``reasoning_budget_tokens``. A body that
    sets either itself is ``invalid_reasoning_tier``: a tier is not combined with native
    thinking controls."""
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise invalid_tier("chat_template_kwargs must be an object")
    if any(name in body for name in BUDGET_FIELDS) or (kwargs is not None and SWITCH in kwargs):
        raise invalid_tier(f"werk.reasoning.tier cannot be combined with {SWITCH} or a reasoning budget field")
    out = {k: v for k, v in body.items() if k != "werk"}
    out["chat_template_kwargs"] = {**(kwargs or {}), SWITCH: budget > 0}
    out["reasoning_budget_tokens"] = budget
    return out


def _resolved_budget(body: JsonObject) -> int | None:
    werk = body.get("werk")
    reasoning = werk.get("reasoning") if isinstance(werk, dict) else None
    budget = reasoning.get("resolved_budget_tokens") if isinstance(reasoning, dict) else None
    return budget if isinstance(budget, int) and not isinstance(budget, bool) and budget >= 0 else None


def forwarded_chat(body: JsonObject) -> JsonObject:
    """The ``/v1/chat/completions`` body llama-server gets: ``werk`` removed, and a tier the host
    resolved (``werk.reasoning.resolved_budget_tokens``) turned into :func:`with_budget`."""
    budget = _resolved_budget(body)
    if budget is None:
        return {k: v for k, v in body.items() if k != "werk"}
    return with_budget(body, budget)


def counted_request(request: ChatRequest) -> ChatRequest:
    """``request`` as the chat sends it, for counting: what :func:`forwarded_chat` makes of its
    body (``werk`` removed; the tier the host resolved before any hook sees the request,
    ``werk.reasoning.resolved_budget_tokens``, as the thinking switch and budget). Nothing is
    resolved here (docs/plugin-kit.md: every chat hook receives the resolved request)."""
    if request.werk is None:
        return request
    return ChatRequest.model_validate(forwarded_chat(request.model_dump(mode="json", exclude_none=True)))

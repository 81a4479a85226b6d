"""The plugin contract: every way the host reaches a backend.

Plugins implement these with ``@werk_host.hookimpl``. ``werk_adapter_factories`` collects
from every plugin; every operation hook is ``firstresult`` and the host dispatches it only
to the plugin that owns the adapter (plus plugins that provide no adapter at all, which
may wrap the call with ``@hookimpl(wrapper=True)`` to observe or veto it).

Errors: an operation hook raises :class:`werk_host.errors.WerkError` with one of the
codes named in its docstring. Returning ``None`` means "not implemented", which the host
reports as ``unsupported``.
"""

from __future__ import annotations

from typing import Any

import pluggy

from werk_host.backend import (
    Adapter,
    AdapterFactory,
    CapabilityReport,
    DecodeOutput,
    DecodeWork,
    InferenceResponse,
    MoveOutput,
    MoveWork,
    PrefilledState,
    PrefillWork,
    Snapshot,
    StoredStateRef,
)
from werk_host.protocol.chat import ChatLimits, ChatRequest, ReasoningProfile
from werk_host.protocol.experts import ExpertActionRequest, ExpertActionResult, ExpertListQuery, ExpertPage
from werk_host.protocol.telemetry import WorkerObservation

hookspec = pluggy.HookspecMarker("werk")


@hookspec
def werk_adapter_factories(config: Any) -> list[AdapterFactory]:  # type: ignore[empty-body]
    """Offer the adapter kinds this plugin provides (collected from every plugin).

    ``config`` is the :class:`werk_host.config.HostConfig`. Must not start processes:
    factories are cheap descriptions; work happens in ``AdapterFactory.create``.
    """


@hookspec(firstresult=True)
def werk_capabilities(adapter: Adapter) -> dict[str, CapabilityReport] | None:
    """Report the adapter's current status for each capability id it knows, from evidence
    gathered now (process alive, probe passed, flag present). Ids it omits are reported
    ``unsupported``. Must be cheap and side-effect free."""


@hookspec(firstresult=True)
def werk_producer_envelope(adapter: Adapter, model_id: str) -> dict[str, str] | None:
    """The complete producer compatibility envelope a new state for ``model_id`` would carry
    now, without doing work. Raises ``unavailable`` when it cannot be established."""


@hookspec(firstresult=True)
def werk_prefill(adapter: Adapter, work: PrefillWork) -> PrefilledState | None:
    """Evaluate the prompt into backend state and return it.

    Raises ``not_found`` (unknown model), ``unavailable`` (process/probe prerequisite
    missing), ``resource_exhausted``, ``internal``."""


@hookspec(firstresult=True)
def werk_snapshot(adapter: Adapter, state: PrefilledState) -> Snapshot | None:
    """Export ``state`` as an opaque, disk-persistable byte stream (bounded chunks).

    Raises ``unsupported`` when no snapshot can be produced, ``unavailable``, ``internal``."""


@hookspec(firstresult=True)
def werk_restore(adapter: Adapter, stored: StoredStateRef) -> PrefilledState | None:
    """Load a stored snapshot back into live backend state (used for reuse checks and
    eager restores). Must verify exact acknowledgements; raises ``corrupt_state``,
    ``incompatible_state``, ``unavailable``."""


@hookspec(firstresult=True)
def werk_decode(adapter: Adapter, work: DecodeWork) -> DecodeOutput | None:
    """Generate from a live handle or, when ``work.handle`` is not live, from
    ``work.stored`` after restoring it. Raises ``corrupt_state``, ``unavailable``,
    ``internal``; never retries elsewhere."""


@hookspec(firstresult=True)
def werk_release_state(adapter: Adapter, handle: Any) -> bool | None:
    """Drop a live handle the host no longer references (e.g. an ephemeral state whose
    handoff expired). Returns ``True`` when released."""


@hookspec(firstresult=True)
def werk_state_move(adapter: Adapter, work: MoveWork) -> MoveOutput | None:
    """Move, pin-prepare or evict a stored state between tiers. With ``dry_run`` it must be
    side-effect free, and raise ``unsupported`` when it cannot preview."""


@hookspec(firstresult=True)
def werk_list_experts(adapter: Adapter, query: ExpertListQuery) -> ExpertPage | None:
    """One page of backend-observed expert residency. Raises ``unsupported``/``unavailable``."""


@hookspec(firstresult=True)
def werk_expert_action(adapter: Adapter, request: ExpertActionRequest) -> ExpertActionResult | None:
    """Prefetch, pin, unpin or evict explicit experts; a dry run changes nothing."""


@hookspec(firstresult=True)
def werk_count_tokens(adapter: Adapter, request: ChatRequest) -> int | None:
    """Exact input-token count of a chat request from the backend's own template and
    tokenizer. Never an estimate: raise ``unsupported`` instead; ``unavailable`` (retryable)
    on a temporary native failure."""


@hookspec(firstresult=True)
def werk_chat_limits(adapter: Adapter, model: str | None) -> ChatLimits | None:
    """Context, output ceiling and configured concurrency for ``model`` (default when
    ``None``), read from manifests and launch arguments only; never loads a model."""


@hookspec(firstresult=True)
def werk_reasoning_profile(
    adapter: Adapter, model: str | None, max_output_tokens: int
) -> ReasoningProfile | None:
    """Reasoning tiers verified from running workers' launch configuration; cold or unknown
    runtimes return ``supported=False`` with no tiers."""


@hookspec(firstresult=True)
def werk_chat_completion(adapter: Adapter, request: dict[str, Any]) -> InferenceResponse | None:
    """Serve an OpenAI chat-completions request (streaming when ``request['stream']``).
    Returns the backend's response streamed, never buffered whole."""


@hookspec(firstresult=True)
def werk_text_completion(adapter: Adapter, request: dict[str, Any]) -> InferenceResponse | None:
    """Serve an OpenAI (legacy) completions request, like ``werk_chat_completion``."""


@hookspec(firstresult=True)
def werk_list_models(adapter: Adapter) -> list[dict[str, Any]] | None:
    """OpenAI ``/v1/models`` entries for the models this adapter serves."""


@hookspec(firstresult=True)
def werk_workers(adapter: Adapter) -> list[WorkerObservation] | None:
    """Fresh observations of the backend's workers (model, pid, state, slots, context).
    Only currently valid samples; unknown fields are ``None``."""


@hookspec(firstresult=True)
def werk_memory_requirement(adapter: Adapter, operation: str, model_id: str) -> int | None:
    """A positive, bounded byte requirement for ``operation`` (``load``, ``restore``,
    ``decode``) before it runs, or ``None`` when the backend cannot bound it."""


#: Hooks that take an adapter and are dispatched to its owning plugin only.
OPERATION_HOOKS: tuple[str, ...] = (
    "werk_capabilities",
    "werk_producer_envelope",
    "werk_prefill",
    "werk_snapshot",
    "werk_restore",
    "werk_decode",
    "werk_release_state",
    "werk_state_move",
    "werk_list_experts",
    "werk_expert_action",
    "werk_count_tokens",
    "werk_chat_limits",
    "werk_reasoning_profile",
    "werk_chat_completion",
    "werk_text_completion",
    "werk_list_models",
    "werk_workers",
    "werk_memory_requirement",
)

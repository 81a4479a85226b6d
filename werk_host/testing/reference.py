"""The reference backend: an in-memory adapter plugin that implements every hook.

It is a real plugin, registered through pluggy like any other, and it implements every hook
of :mod:`werk_host.hookspecs` with the declared types, so it doubles as a worked example of
the contract: the plugin object offers the factory (and the collected hooks); every operation
is a method of its adapter, :class:`~werk_host.testing.reference_adapter.MemoryAdapter`. Its
"backend" is trivial and deterministic:

* a prompt's state is its UTF-8 bytes (messages: their JSON); a token is a word;
* decode and completions echo a bounded number of the prompt's words;
* chat ``usage.prompt_tokens`` equals what ``werk_count_tokens`` says for the same messages
  (words per message + 2), and ``stream: true`` answers OpenAI SSE chunks ending ``[DONE]``;
* one in-process "worker", eight experts per model (``layer0.expert0`` … ``layer0.expert7``,
  alternately ``ram`` and ``external``) and an optional RAM state tier;
* one session slot for ``werk_session_slot`` (:class:`MemorySessionSlot`): the
  tokens of the last session chat, reused by the next one up to their common prefix, which its
  usage reports as ``prompt_tokens_details.cached_tokens``.

Its capability report is configurable (``statuses``, keyed by
:class:`~werk_host.protocol.CapabilityId`), so tests can check that the host's behaviour follows
every status; ``fail`` injects failures (see :meth:`MemoryAdapter.check`).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping
from typing import Final

from werk_host import hookimpl
from werk_host.backend import (
    AdapterFactory,
    CapabilityReport,
    DecodeOutput,
    DecodeWork,
    DoctorCheck,
    InferenceResponse,
    JsonObject,
    MemoryOperation,
    MoveOutput,
    MoveWork,
    PrefilledState,
    PrefillWork,
    Snapshot,
    StoredStateRef,
)
from werk_host.config import HostConfig
from werk_host.models import ModelManifest
from werk_host.protocol import (
    CapabilityId,
    CapabilityStatus,
    ChatLimits,
    ChatRequest,
    DeploymentPlan,
    ExpertActionRequest,
    ExpertActionResult,
    ExpertListQuery,
    ExpertPage,
    ReasoningProfile,
    WorkerObservation,
)
from werk_host.testing.reference_adapter import MemoryAdapter, MemorySessionSlot, default_experts
from werk_host.testing.reference_base import (
    BACKEND_ID,
    CONTEXT_TOKENS,
    EXPERIMENTAL_STATE,
    EXPERTS_PER_MODEL,
    MAX_OUTPUT_TOKENS,
    PLUGIN_NAME,
    chat_answer,
    count_chat_tokens,
    session_tokens,
)


class MemoryBackendPlugin:
    """The reference plugin object: offers :class:`MemoryAdapter` and implements every hook.

    Keyword arguments become every created adapter's initial settings; created adapters are
    kept in ``adapters`` (newest last).
    """

    #: The name to register it under (``werk_host.testing.hosts.make_host`` reads it).
    name: Final = PLUGIN_NAME
    #: The adapter class :meth:`create` builds: a subclass changes operations the 0.3 way.
    adapter_class: type[MemoryAdapter] = MemoryAdapter

    def __init__(
        self,
        *,
        statuses: Mapping[CapabilityId, CapabilityStatus] | None = None,
        fail: Iterable[str] = (),
        memory_requirement: int | None = None,
        max_pinned_experts: int | None = None,
    ) -> None:
        self.statuses = dict(statuses if statuses is not None else EXPERIMENTAL_STATE)
        self.fail = set(fail)
        self.memory_requirement = memory_requirement
        self.max_pinned_experts = max_pinned_experts
        self.adapters: list[MemoryAdapter] = []

    def create(self, config: HostConfig, model: ModelManifest | None) -> MemoryAdapter:
        adapter = self.adapter_class(
            model_name=model.name if model else "none",
            statuses=dict(self.statuses),
            fail=set(self.fail),
            memory_requirement=self.memory_requirement,
            max_pinned_experts=self.max_pinned_experts,
        )
        adapter.plugin = self
        self.adapters.append(adapter)
        return adapter

    # -- discovery -------------------------------------------------------------------------
    @hookimpl
    def werk_adapter_factories(self, config: HostConfig) -> list[AdapterFactory]:
        known = {c.value for c in CapabilityId}
        declared = tuple(CapabilityId(k) for k in self.statuses if k in known)
        return [
            AdapterFactory(
                BACKEND_ID,
                lambda m: m is not None,
                self.create,
                "in-memory reference backend (werk_host.testing)",
                capabilities=declared,
            )
        ]

    @hookimpl
    def werk_doctor_checks(self, config: HostConfig) -> list[DoctorCheck]:
        return [DoctorCheck("testbackend.engine", "ok", "the reference backend runs in process")]

    @hookimpl
    def werk_cli_commands(self, subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
        """The reference backend adds no ``werk`` commands (werk-llamacpp's ``werk llamacpp`` does)."""

    # -- the hook API 0.2 form, for subclasses ------------------------------------------------
    # Not hook implementations: the adapter's methods are. A subclass that marks one of these
    # ``@hookimpl`` answers that operation for its adapters (its implementation runs before
    # the adapter's; returning ``None`` leaves the answer to the adapter) and may call
    # ``super()`` for the adapter's answer.
    def werk_capabilities(self, adapter: MemoryAdapter) -> Mapping[CapabilityId, CapabilityReport]:
        return adapter.capabilities()

    def werk_compat_key(self, adapter: MemoryAdapter, model_id: str) -> dict[str, str]:
        return adapter.compat_key(model_id)

    def werk_prefill(self, adapter: MemoryAdapter, work: PrefillWork) -> PrefilledState:
        return adapter.prefill(work)

    def werk_snapshot(self, adapter: MemoryAdapter, state: PrefilledState) -> Snapshot:
        return adapter.snapshot(state)

    def werk_restore(self, adapter: MemoryAdapter, stored: StoredStateRef) -> PrefilledState:
        return adapter.restore(stored)

    def werk_decode(self, adapter: MemoryAdapter, work: DecodeWork) -> DecodeOutput:
        return adapter.decode(work)

    def werk_release_state(self, adapter: MemoryAdapter, handle: object) -> bool:
        return adapter.release_state(handle)

    def werk_state_move(self, adapter: MemoryAdapter, work: MoveWork) -> MoveOutput:
        return adapter.state_move(work)

    def werk_list_experts(self, adapter: MemoryAdapter, query: ExpertListQuery) -> ExpertPage:
        return adapter.list_experts(query)

    def werk_expert_action(self, adapter: MemoryAdapter, request: ExpertActionRequest) -> ExpertActionResult:
        return adapter.expert_action(request)

    def werk_count_tokens(self, adapter: MemoryAdapter, request: ChatRequest) -> int:
        return adapter.count_tokens(request)

    def werk_chat_limits(self, adapter: MemoryAdapter, model: str | None) -> ChatLimits:
        return adapter.chat_limits(model)

    def werk_reasoning_profile(
        self, adapter: MemoryAdapter, model: str | None, max_output_tokens: int
    ) -> ReasoningProfile:
        return adapter.reasoning_profile(model, max_output_tokens)

    def werk_chat_completion(self, adapter: MemoryAdapter, request: JsonObject) -> InferenceResponse:
        return adapter.chat_completion(request)

    def werk_session_slot(self, adapter: MemoryAdapter, model_id: str) -> MemorySessionSlot:
        return adapter.open_session_slot(model_id)

    def werk_text_completion(self, adapter: MemoryAdapter, request: JsonObject) -> InferenceResponse:
        return adapter.text_completion(request)

    def werk_workers(self, adapter: MemoryAdapter) -> list[WorkerObservation]:
        return adapter.workers()

    def werk_memory_requirement(self, adapter: MemoryAdapter, operation: MemoryOperation, model_id: str) -> int | None:
        return adapter.memory_bound(operation, model_id)

    def werk_deployment_plan(self, adapter: MemoryAdapter) -> DeploymentPlan | None:
        return adapter.deployment_plan()

    def chat_answer(
        self, adapter: MemoryAdapter, request: JsonObject, out: list[str], finish: str, usage: JsonObject
    ) -> InferenceResponse:
        """The chat-completion response (streamed when asked) carrying ``out`` and ``usage``."""
        return chat_answer(adapter.model_name, request, out, finish, usage)


__all__ = [
    "BACKEND_ID",
    "CONTEXT_TOKENS",
    "EXPERIMENTAL_STATE",
    "EXPERTS_PER_MODEL",
    "MAX_OUTPUT_TOKENS",
    "PLUGIN_NAME",
    "MemoryAdapter",
    "MemoryBackendPlugin",
    "MemorySessionSlot",
    "count_chat_tokens",
    "default_experts",
    "session_tokens",
]

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
* with ``prompt_cache=N``, N ordinary slots as prompt caches for ``werk_prompt_cache``
  (:mod:`werk_host.testing.reference_cache`; none by default, and the hook answers ``None``);
* one session slot for ``werk_session_slot`` (:class:`MemorySessionSlot`): the
  tokens of the last session chat, reused by the next one up to their common prefix, which its
  usage reports as ``prompt_tokens_details.cached_tokens``.

Its capability report is configurable (``statuses``, keyed by
:class:`~werk_host.protocol.CapabilityId`), so tests can check that the host's behaviour follows
every status; ``fail`` injects failures (see :meth:`MemoryAdapter.check`).

To change an operation, do what a third-party backend does: subclass the adapter, mark the
method with the operation's hookimpl (``super()`` gives the reference answer) and name the
class as the plugin's ``adapter_class``. The adapter reaches the plugin that created it as
``self.plugin`` (annotate it with the plugin subclass), where a test keeps its own state::

    class HeldAdapter(MemoryAdapter):
        plugin: HeldStreams

        @hookimpl(specname="werk_chat_limits")
        def chat_limits(self, model: str | None) -> ChatLimits:
            limits = super().chat_limits(model)
            return limits.model_copy(update={"max_concurrent_requests": self.plugin.capacity})

    class HeldStreams(MemoryBackendPlugin):
        adapter_class = HeldAdapter

A plugin object that offers factories never implements an operation hook itself: the host
lists it ``failed`` (docs/plugin-hooks.md, "Ownership").
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping
from typing import Final

from werk_host import hookimpl
from werk_host.config import HostConfig
from werk_host.models import ModelManifest
from werk_host.protocol import CapabilityId, CapabilityStatus
from werk_host.seam import AdapterFactory, DoctorCheck, MemoryEstimate
from werk_host.testing.reference_adapter import MemoryAdapter, MemorySessionSlot, default_experts
from werk_host.testing.reference_base import (
    BACKEND_ID,
    CONTEXT_TOKENS,
    EXPERIMENTAL_STATE,
    EXPERTS_PER_MODEL,
    MAX_OUTPUT_TOKENS,
    PLUGIN_NAME,
    count_chat_tokens,
    session_tokens,
)


class MemoryBackendPlugin:
    """The reference plugin object: offers :class:`MemoryAdapter` (whose methods implement every
    operation hook) and implements the collected hooks.

    Keyword arguments become every created adapter's initial settings; created adapters are
    kept in ``adapters`` (newest last).
    """

    #: The name to register it under (``werk_host.testing.hosts.make_host`` reads it).
    name: Final = PLUGIN_NAME
    #: The adapter class :meth:`create` builds: a subclass of :class:`MemoryAdapter` changes
    #: operations (the module docstring shows how).
    adapter_class: type[MemoryAdapter] = MemoryAdapter

    def __init__(
        self,
        *,
        statuses: Mapping[CapabilityId, CapabilityStatus] | None = None,
        fail: Iterable[str] = (),
        memory_requirement: int | None = None,
        max_pinned_experts: int | None = None,
        prompt_cache: int = 0,
        context_tokens: int = CONTEXT_TOKENS,
        memory_estimate: MemoryEstimate | None = None,
    ) -> None:
        self.context_tokens = context_tokens
        #: what the factory's ``memory_estimate`` answers for every model (``None``: no estimate)
        self.memory_estimate = memory_estimate
        self.statuses = dict(statuses if statuses is not None else EXPERIMENTAL_STATE)
        self.prompt_cache = prompt_cache
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
            prompt_cache=self.prompt_cache,
            context_tokens=self.context_tokens,
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
                memory_estimate=lambda _config, _model: self.memory_estimate,
            )
        ]

    @hookimpl
    def werk_doctor_checks(self, config: HostConfig) -> list[DoctorCheck]:
        return [DoctorCheck("testbackend.engine", "ok", "the reference backend runs in process")]

    @hookimpl
    def werk_cli_commands(self, subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
        """The reference backend adds no ``werk`` commands (werk-llamacpp's ``werk llamacpp`` does)."""


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

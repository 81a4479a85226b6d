"""The plugin contract: every way the host reaches a backend (docs/plugin-hooks.md).

Plugins implement these with ``@werk_host.hookimpl`` (``werk_host.plugin.hookimpl``). The
plugin module implements the *collected* hooks, called on every plugin:
``werk_adapter_factories``, ``werk_doctor_checks`` and ``werk_cli_commands``. Every other hook
is an *operation hook* (``firstresult``) and is implemented on the adapter class, once: each
operation is one method marked ``@hookimpl(specname="werk_prefill")``, without the spec's
``adapter`` argument (it is ``self``)::

    class EchoAdapter:
        @hookimpl(specname="werk_prefill")
        def prefill(self, work: PrefillWork) -> PrefilledState: ...

The host registers each adapter it creates with the plugin manager and unregisters it when it
closes; a call on an adapter reaches that adapter's methods only, plus the implementations of
plugins that offer no adapters at all (audit, metrics), which take ``adapter`` as a plain
argument and may wrap the call with ``@hookimpl(wrapper=True)`` to observe or veto it. The
owner of an adapter is the plugin whose factory created it (docs/plugin-hooks.md,
"Ownership"). An installed backend plugin whose module still implements an operation hook
itself (the hook API 0.2 form) is listed ``failed`` and never loaded into the seam.

Errors: an operation hook raises :class:`werk_host.errors.WerkError` with one of the codes
named in its docstring. Returning ``None`` means "not implemented", which the host reports as
``unsupported`` (HTTP 501). Host code never calls these by name: it goes through the typed
facade :class:`werk_host.hooks.BackendHooks`.

This module's docstrings are the hook reference: ``docs/plugin-hooks.md`` is generated from
them (``python -m werk_host.hookdocs``) and a test fails when it is stale.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Final

import pluggy

from werk_host.config import HostConfig
from werk_host.protocol.chat import ChatLimits, ChatRequest, ReasoningProfile
from werk_host.protocol.deployments import DeploymentPlan
from werk_host.protocol.discovery import CapabilityId
from werk_host.protocol.embeddings import EmbeddingLimits, EmbeddingResult, RerankResult
from werk_host.protocol.experts import ExpertActionRequest, ExpertActionResult, ExpertListQuery, ExpertPage
from werk_host.protocol.media import ImageLimits, ImageResult
from werk_host.protocol.speech import SpeechLimits, SpeechResult
from werk_host.protocol.telemetry import WorkerObservation
from werk_host.seam import (
    Adapter,
    AdapterFactory,
    CapabilityReport,
    DecodeOutput,
    DecodeWork,
    DoctorCheck,
    EmbeddingWork,
    ImageWork,
    InferenceResponse,
    JsonObject,
    MemoryOperation,
    MoveOutput,
    MoveWork,
    PrefilledState,
    PrefillWork,
    PromptCache,
    RerankWork,
    SessionSlot,
    Snapshot,
    SpeechWork,
    StoredStateRef,
)

#: The version of this hook API. It changes with the host's minor version while the host is
#: 0.x: a plugin declares ``werk-host>=0.6,<0.7`` in its requirements and the host refuses to
#: load a plugin whose declared range excludes the running host (docs/plugin-hooks.md). 0.3:
#: operation hooks are adapter methods; ``AdapterFactory.plugin_name`` is derived. 0.4: the
#: media hooks ``werk_image_limits`` and ``werk_image_generation`` (docs/media.md). 0.5: the
#: speech hooks ``werk_speech_limits`` and ``werk_speech_synthesis`` (docs/media.md, "Speech").
#: 0.6: the embedding hooks ``werk_embedding_limits``, ``werk_embed``, ``werk_rerank`` and
#: ``werk_tokenize`` (docs/embeddings.md).
HOOK_API_VERSION: Final = "0.6"

hookspec = pluggy.HookspecMarker("werk")


@hookspec
def werk_adapter_factories(config: HostConfig) -> list[AdapterFactory]:  # type: ignore[empty-body]
    """Offer the adapter kinds this plugin provides (collected from every plugin).

    Each :class:`~werk_host.seam.AdapterFactory` names its backend id, says which models it
    ``accepts`` and builds adapters in ``create``; its owner is this plugin (the host fills in
    ``plugin_name``: one given that is not the plugin's entry-point name fails the plugin). Must not start
    processes: factories are cheap descriptions; work happens in ``create``. A factory may
    give ``validate_options``: the host calls it with each deployment instance's profile
    ``options`` when ``werk serve`` starts, and a :class:`ValueError` it raises refuses the
    profile (docs/plugin-kit.md, "Options"). A factory may give ``memory_estimate``: before an
    instance's first start the host asks it for a :class:`~werk_host.seam.MemoryEstimate` (the
    KV cache of the configured context, the share of layers on an accelerator) and admits the
    start against host and accelerator memory (docs/plugin-kit.md, "Memory estimate").
    """


@hookspec
def werk_cli_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add this plugin's ``werk <name> ...`` sub-commands (collected from every plugin).

    ``subparsers`` is the ``werk`` parser's sub-command set: call
    ``subparsers.add_parser(name, help=...)`` (name the command after the plugin) and give each
    leaf parser ``set_defaults(handler=fn)``, where ``fn(args: argparse.Namespace) -> int``
    returns the exit code. Called every time ``werk`` builds its parser, ``werk --help``
    included (not for ``werk serve``, ``run`` and ``chat``: docs/operations.md, "Start-up"),
    so it must be cheap: add arguments only and import the command's work inside
    ``fn``. To build the parser the host imports only the module the plugin names in the
    ``werk.cli`` entry-point group (keep it small: it decides how fast every ``werk`` command
    starts), and a plugin module implements the hook too by importing it from there. A hook
    that raises, or takes a command name already in use, adds no command: ``werk`` keeps
    working, says so in one line on stderr, and ``werk plugins`` lists it under the plugin's
    ``problems`` (docs/plugin-kit.md, "Commands").
    """


@hookspec
def werk_doctor_checks(config: HostConfig) -> list[DoctorCheck]:  # type: ignore[empty-body]
    """Check what this plugin's engines need on this machine, for ``werk doctor`` (collected
    from every plugin; docs/plugin-kit.md, "Doctor checks").

    Each :class:`~werk_host.seam.DoctorCheck` names one thing (an executable, a native
    module, the platform), its ``ok``/``warn``/``fail`` status, what was found and, unless
    ``ok``, the fix: a command to run or a setting to change. Must be cheap: it loads no model
    and starts no process except short ``--version``/``--help`` probes with a time bound. An
    exception it raises, or a value that is not a list of checks, is reported as a ``fail`` of
    the plugin and never stops the other checks.
    """


@hookspec(firstresult=True)
def werk_capabilities(adapter: Adapter) -> Mapping[CapabilityId, CapabilityReport] | None:
    """Report the adapter's current status for each capability id it knows, from evidence
    gathered now (process alive, probe passed, flag present), never from a name or version.

    Ids it omits are reported ``unsupported``. A key that is not a
    :class:`~werk_host.protocol.CapabilityId` is a plugin defect: the host ignores it, logs
    it and lists it under the plugin's ``problems`` in ``werk plugins``. Must be cheap and
    side-effect free. The host reuses a report for at most a second per adapter identity, and
    asks afresh as soon as a hook that may change evidence (prefill, restore, decode, chat, ...)
    has returned (docs/plugin-hooks.md, "Capability ids").

    Adapter method: ``@hookimpl(specname="werk_capabilities") def capabilities(self)``."""


@hookspec(firstresult=True)
def werk_compat_key(adapter: Adapter, model_id: str) -> dict[str, str] | None:
    """The complete producer compatibility key a new state for ``model_id`` would carry
    now, without doing work: every dimension that decides whether a snapshot can be restored
    (binary and flag fingerprints, effective arguments, model identity, cache layout, process
    generation where restores are per process), each a string. A stored state is reusable
    only when its compatibility key equals this one exactly; there are no wildcards. Raises
    ``unavailable`` when it cannot be established.

    Adapter method: ``@hookimpl(specname="werk_compat_key") def compat_key(self, model_id)``."""


@hookspec(firstresult=True)
def werk_prefill(adapter: Adapter, work: PrefillWork) -> PrefilledState | None:
    """Evaluate the prompt into backend state and return it (an opaque ``handle``).

    Raises ``not_found`` (unknown model), ``unavailable`` (process/probe prerequisite
    missing), ``resource_exhausted``, ``internal``.

    Adapter method: ``@hookimpl(specname="werk_prefill") def prefill(self, work)``."""


@hookspec(firstresult=True)
def werk_snapshot(adapter: Adapter, state: PrefilledState) -> Snapshot | None:
    """Export ``state`` as an opaque, disk-persistable byte stream (bounded chunks). The host
    streams it into the state store and hashes it; it never interprets the bytes.

    Raises ``unsupported`` when no snapshot can be produced, ``unavailable``, ``internal``.

    Adapter method: ``@hookimpl(specname="werk_snapshot") def snapshot(self, state)``."""


@hookspec(firstresult=True)
def werk_restore(adapter: Adapter, stored: StoredStateRef) -> PrefilledState | None:
    """Load a stored snapshot back into live backend state (reuse checks and eager restores).

    Read the payload only through ``stored.open_payload()`` (integrity verified first). Must
    verify the backend's exact acknowledgements; raises ``corrupt_state``,
    ``incompatible_state``, ``unavailable``.

    Adapter method: ``@hookimpl(specname="werk_restore") def restore(self, stored)``."""


@hookspec(firstresult=True)
def werk_decode(adapter: Adapter, work: DecodeWork) -> DecodeOutput | None:
    """Generate from a live handle or, when ``work.handle`` is not live, from
    ``work.stored`` after restoring it. May return ``next_state`` for a continuation
    handoff. Raises ``corrupt_state``, ``unavailable``, ``internal``; never retries on
    another backend.

    Adapter method: ``@hookimpl(specname="werk_decode") def decode(self, work)``."""


@hookspec(firstresult=True)
def werk_release_state(adapter: Adapter, handle: object) -> bool | None:
    """Drop a live handle the host no longer references (e.g. an ephemeral state whose
    handoff expired). Returns ``True`` when released, ``False`` when it was already gone.

    Adapter method: ``@hookimpl(specname="werk_release_state") def release_state(self, handle)``."""


@hookspec(firstresult=True)
def werk_state_move(adapter: Adapter, work: MoveWork) -> MoveOutput | None:
    """Move, pin-prepare or evict a stored state between tiers. With ``dry_run`` it must be
    side-effect free, and raise ``unsupported`` when it cannot preview.

    Adapter method: ``@hookimpl(specname="werk_state_move") def state_move(self, work)``."""


@hookspec(firstresult=True)
def werk_list_experts(adapter: Adapter, query: ExpertListQuery) -> ExpertPage | None:
    """One page of backend-observed expert residency (``ram`` for experts the backend holds,
    ``external`` for disk-backed ones). Raises ``unsupported``/``unavailable``.

    Adapter method: ``@hookimpl(specname="werk_list_experts") def list_experts(self, query)``."""


@hookspec(firstresult=True)
def werk_expert_action(adapter: Adapter, request: ExpertActionRequest) -> ExpertActionResult | None:
    """Prefetch, pin, unpin or evict explicit experts; a dry run changes nothing. Raises
    ``not_found`` for an unknown expert id, ``invalid_request`` for a target tier the
    backend cannot hold, ``resource_exhausted`` when pins would exceed the budget.

    Adapter method: ``@hookimpl(specname="werk_expert_action") def expert_action(self, request)``."""


@hookspec(firstresult=True)
def werk_count_tokens(adapter: Adapter, request: ChatRequest) -> int | None:
    """Exact input-token count of a chat request from the backend's own template and
    tokenizer: the ``prompt_tokens`` the backend's ``/v1`` usage would report. Never an
    estimate: raise ``unsupported`` instead; ``unavailable`` (retryable) on a temporary
    native failure; ``invalid_request`` for content the model cannot take. Besides
    count_tokens and near-limit admission, the host calls it for about 25 short sentinel
    requests once per adapter identity, in its fourth plain admission (``CALIBRATE_AFTER``;
    the first three are counted exactly), to calibrate its admission upper bound
    (:mod:`werk_host.service.admission`), and checks that bound against the usage the backend
    later reports, so the count must equal that usage exactly.

    Adapter method: ``@hookimpl(specname="werk_count_tokens") def count_tokens(self, request)``."""


@hookspec(firstresult=True)
def werk_request_options(adapter: Adapter, name: str, options: JsonObject) -> JsonObject | None:
    """Validate ``werk.<name>``, a backend member of a chat request (any ``werk`` member but the
    host's own ``reasoning``), before the host counts, admits or serves the request: return the
    validated options (what the chat hooks then receive as ``request["werk"][name]``), or raise
    ``invalid_request`` naming the field (``werk.<name>.<field>: ...``). ``None`` (not this
    backend's option) makes the host answer ``invalid_request`` ``werk.<name> is not supported
    by backend <id>``; chat and the planning routes fail alike (:mod:`werk_host.plugin.options`).

    Adapter method: ``@hookimpl(specname="werk_request_options") def request_options(self, name, options)``."""


@hookspec(firstresult=True)
def werk_chat_limits(adapter: Adapter, model: str | None) -> ChatLimits | None:
    """Context, output ceiling and configured concurrency for ``model`` (default when
    ``None``), read from manifests and launch arguments only; never loads a model.
    ``max_concurrent_requests`` is what the instance runs at once (``None``: unknown; the
    host's gate then holds it to ``werk serve --inference-slots``). Set ``engine_queues=True``
    when a request beyond that capacity waits in the backend's own scheduler at no harm (a
    continuously batching engine, a remote server with its own admission): an unknown capacity
    then leaves the instance to the host-wide and per-key bounds alone (docs/operations.md,
    "Inference concurrency"). It is the host's alone: ``GET /werk/v1/chat/limits`` never
    carries it.

    Adapter method: ``@hookimpl(specname="werk_chat_limits") def chat_limits(self, model)``."""


@hookspec(firstresult=True)
def werk_reasoning_profile(adapter: Adapter, model: str | None, max_output_tokens: int) -> ReasoningProfile | None:
    """Reasoning tiers verified from running workers' launch configuration; cold or unknown
    runtimes return ``supported=False`` with no tiers.

    Adapter method: ``@hookimpl(specname="werk_reasoning_profile")
    def reasoning_profile(self, model, max_output_tokens)``."""


@hookspec(firstresult=True)
def werk_chat_completion(adapter: Adapter, request: JsonObject) -> InferenceResponse | None:
    """Serve an OpenAI chat-completions request body (streaming when ``request["stream"]``).
    Returns the backend's response streamed, never buffered whole; honour
    :data:`werk_host.seam.client_disconnected` while waiting for the first byte.

    Adapter method: ``@hookimpl(specname="werk_chat_completion") def chat_completion(self, request)``."""


@hookspec(firstresult=True)
def werk_session_slot(adapter: Adapter, model_id: str) -> SessionSlot | None:
    """The session slot of ``model_id`` on the adapter's live backend process, for
    ``werk chat``/``werk run`` with a session (docs/chat.md, "Native snapshots"): an object
    implementing :class:`~werk_host.seam.SessionSlot`. Must be cheap and run no
    inference (the host asks when a session opens). ``None`` (not implemented) means the backend
    keeps no native session snapshots; raise ``unsupported`` when this process cannot take them
    (e.g. its launch arguments disable slot saving) and ``unavailable`` when none runs.

    Adapter method: ``@hookimpl(specname="werk_session_slot") def open_session_slot(self, model_id)``."""


@hookspec(firstresult=True)
def werk_prompt_cache(adapter: Adapter) -> PromptCache | None:
    """The adapter's slots as automatic prompt caches for ordinary ``/v1`` (and so Anthropic,
    Ollama and Responses) requests (docs/prompt-cache.md): an object implementing
    :class:`~werk_host.seam.PromptCache`, or ``None`` (not implemented) when the backend keeps
    its prefix caches itself. Must be cheap and run no inference (the host asks per request).
    The host then serves the adapter's ordinary chat and text requests through its leases.

    Adapter method: ``@hookimpl(specname="werk_prompt_cache") def prompt_cache(self)``."""


@hookspec(firstresult=True)
def werk_text_completion(adapter: Adapter, request: JsonObject) -> InferenceResponse | None:
    """Serve an OpenAI (legacy) completions request body, like ``werk_chat_completion``.

    Adapter method: ``@hookimpl(specname="werk_text_completion") def text_completion(self, request)``."""


@hookspec(firstresult=True)
def werk_workers(adapter: Adapter) -> list[WorkerObservation] | None:
    """Fresh observations of the backend's workers (model, pid, state, slots, context).
    Only currently valid samples; unknown fields are ``None``.

    Adapter method: ``@hookimpl(specname="werk_workers") def workers(self)``."""


@hookspec(firstresult=True)
def werk_memory_requirement(adapter: Adapter, operation: MemoryOperation, model_id: str) -> int | None:
    """A positive, bounded byte requirement for ``operation`` (``load``, ``restore``,
    ``decode``) before it runs, or ``None`` when the backend cannot bound it. The host
    reserves it against the memory budget (``runtime.memory.reservations``).

    Adapter method: ``@hookimpl(specname="werk_memory_requirement")
    def memory_requirement(self, operation, model_id)``."""


@hookspec(firstresult=True)
def werk_deployment_plan(adapter: Adapter) -> DeploymentPlan | None:
    """The resolved placement the adapter's backend runs with now: effective launch arguments
    (secrets and filesystem paths replaced by placeholders), threads, parallel slots, context
    per slot and device placement, read from the running process's configuration. ``None``
    when nothing runs. An adapter that answers reports ``runtime.placement`` as ``supported``
    (docs/deployments.md, "Inventory").

    Adapter method: ``@hookimpl(specname="werk_deployment_plan") def deployment_plan(self)``."""


@hookspec(firstresult=True)
def werk_log_tail(adapter: Adapter, lines: int) -> list[str] | None:
    """The last ``lines`` lines (oldest first) of the backend's own log, for an operator's
    ``GET /werk/v1/deployments/{id}/logs`` (docs/deployments.md, "Operator actions"), or
    ``None`` when the backend keeps none. Redact before answering, as for a startup error:
    no key, token or other secret (``werk_host.plugin.process.public_log_lines`` also replaces
    filesystem paths and process ids). The host applies the same redaction again, keeps at most
    ``lines`` lines and shows them apart from its own lifecycle events.

    Adapter method: ``@hookimpl(specname="werk_log_tail") def log_tail(self, lines)``."""


@hookspec(firstresult=True)
def werk_image_limits(adapter: Adapter) -> ImageLimits | None:
    """What this media adapter accepts: its sampler names (AUTOMATIC1111's, ``Euler a`` and the
    like), its default sampler, size and steps, and whether it does image-to-image
    (docs/media.md, "The media seam"). The host validates every image request against it before
    any work, on every route. Cheap: no model load, no process start.

    Adapter method: ``@hookimpl(specname="werk_image_limits") def image_limits(self)``."""


@hookspec(firstresult=True)
def werk_image_generation(adapter: Adapter, work: ImageWork) -> ImageResult | None:
    """Generate ``work.request.n`` images (text-to-image, or image-to-image when
    ``work.request.init_image`` is set), PNG bytes each, image *i* seeded with
    ``work.request.seed + i``; the same request gives the same bytes. Calls
    ``work.progress(step, steps)`` after every denoising step and polls ``work.cancelled()``
    there: once true it stops and raises ``conflict`` ("cancelled"). Blocks until done; the host
    calls it from a request thread or a job's (docs/media.md, "Jobs").

    Errors: ``invalid_request`` for a request the pipeline cannot run (image-to-image on a
    pipeline without it), ``unavailable`` (retryable) when the engine is down or died during the
    work, ``conflict`` when cancelled.

    Adapter method: ``@hookimpl(specname="werk_image_generation") def generate_image(self, work)``."""


@hookspec(firstresult=True)
def werk_speech_limits(adapter: Adapter) -> SpeechLimits | None:
    """What this speech adapter offers: its model's voices and languages, the audio formats its
    engine environment encodes (and its default), whether it takes ``instructions`` (a style
    prompt) and a ``speed``, whether it streams, its sample rate (docs/media.md, "Speech"). The
    host validates every speech request against it before any work, on every route. Cheap and
    from evidence (the model's own files, the engine environment): no model load.

    Adapter method: ``@hookimpl(specname="werk_speech_limits") def speech_limits(self)``."""


@hookspec(firstresult=True)
def werk_speech_synthesis(adapter: Adapter, work: SpeechWork) -> SpeechResult | None:
    """Synthesize ``work.request.input`` in ``work.request.voice``, encoded as
    ``work.request.response_format``, seeded with ``work.request.seed``: the same request gives
    the same samples. Polls ``work.cancelled()`` where the engine allows and, once true, stops
    and raises ``conflict`` ("cancelled"). Blocks until done; the host calls it from a request
    thread or a job's (docs/media.md, "Jobs").

    Errors: ``invalid_request`` for a request the model cannot run, ``unavailable`` (retryable)
    when the engine is down or died during the work, ``conflict`` when cancelled.

    Adapter method: ``@hookimpl(specname="werk_speech_synthesis") def synthesize(self, work)``."""


@hookspec(firstresult=True)
def werk_embedding_limits(adapter: Adapter) -> EmbeddingLimits | None:
    """What this embedding (or reranking) instance offers: its vectors' width, pooling, whether
    they are L2-normalized, the longest input in tokens, the most inputs per call and its
    concurrent requests, ``rerank`` for a reranking instance (docs/embeddings.md). ``None``: this
    adapter computes no embeddings (a chat instance), and the embedding routes refuse it with
    400. From evidence (the running engine's own answers), cached after the first call.

    Adapter method: ``@hookimpl(specname="werk_embedding_limits") def embedding_limits(self)``."""


@hookspec(firstresult=True)
def werk_embed(adapter: Adapter, work: EmbeddingWork) -> EmbeddingResult | None:
    """One vector per input of ``work.inputs`` (strings or token ids), in order, with the prompt
    tokens the engine counted. The host has bounded the batch by ``max_batch_inputs`` and every
    input by ``max_input_tokens`` before the call. Blocks until done.

    Errors: ``invalid_request`` for an input the model cannot embed, ``unavailable`` (retryable)
    when the engine is down or died during the work.

    Adapter method: ``@hookimpl(specname="werk_embed") def embed(self, work)``."""


@hookspec(firstresult=True)
def werk_rerank(adapter: Adapter, work: RerankWork) -> RerankResult | None:
    """One relevance score per document of ``work.documents`` for ``work.query``, in the
    documents' order (the host sorts and cuts ``top_n``), with the prompt tokens counted.

    Adapter method: ``@hookimpl(specname="werk_rerank") def rerank(self, work)``."""


@hookspec(firstresult=True)
def werk_tokenize(adapter: Adapter, text: str) -> list[int] | None:
    """The token ids the engine feeds for ``text`` as one embedding input (special tokens
    included). The host asks only for an input that may exceed ``max_input_tokens``, to refuse
    it with the limit named or, when the client asked, to truncate it (docs/embeddings.md).

    Adapter method: ``@hookimpl(specname="werk_tokenize") def tokenize(self, text)``."""

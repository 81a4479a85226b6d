"""Types that cross the plugin boundary between the host and a backend adapter.

The host never interprets backend state: a prefilled state is an opaque ``handle``
plus an opaque byte snapshot the host stores and streams back verbatim.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager
from contextvars import ContextVar
from dataclasses import dataclass, field
from enum import StrEnum
from typing import BinaryIO, Protocol, runtime_checkable

from pydantic import JsonValue

from werk_host.config import HostConfig
from werk_host.models import ModelManifest
from werk_host.protocol.base import CapabilityStatus, Tier
from werk_host.protocol.discovery import CapabilityId
from werk_host.protocol.embeddings import EmbedInput
from werk_host.protocol.media import ImageRequest
from werk_host.protocol.pd import MessagesInput, TextInput
from werk_host.protocol.speech import SpeechRequest

#: A JSON object as it crosses the seam (OpenAI bodies, model entries, adapter metadata).
JsonObject = dict[str, JsonValue]


class MemoryOperation(StrEnum):
    """What ``werk_memory_requirement`` is asked to bound."""

    LOAD = "load"
    RESTORE = "restore"
    DECODE = "decode"


@dataclass(frozen=True)
class MemoryEstimate:
    """What a backend expects an instance to need beyond its model files, before its first start
    (``AdapterFactory.memory_estimate``; docs/deployments.md, "Memory estimate").

    ``kv_bytes``: the KV cache (and any other per-context state) for the context the instance is
    configured with, ``context_tokens`` (all slots together; ``None`` when unknown).
    ``accelerator_share``: the share, 0 to 1, of the model's layers (so of its weights and KV
    cache) its launch configuration places on an accelerator. The host adds the model files'
    size and its documented overhead, and checks host and accelerator memory.
    """

    kv_bytes: int
    context_tokens: int | None = None
    accelerator_share: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.kv_bytes, bool) or not isinstance(self.kv_bytes, int) or self.kv_bytes < 0:
            raise ValueError("a memory estimate's kv_bytes is a non-negative integer")
        if not 0.0 <= self.accelerator_share <= 1.0:
            raise ValueError("a memory estimate's accelerator_share is between 0 and 1")


@runtime_checkable
class Adapter(Protocol):
    """A live backend adapter instance.

    ``instance_id`` names this adapter (e.g. ``llamacpp:my-model``); ``backend`` is the
    backend id reported as ``active_backend``. Its operations are its own methods marked
    ``@hookimpl(specname="werk_...")``: the host registers each adapter it creates with the
    plugin manager and calls only that adapter's methods (plus wrapper plugins) for it. Its
    owner is the plugin whose factory created it; an adapter needs no attribute naming it (one
    named ``plugin_name`` must agree, docs/plugin-hooks.md, "Ownership").
    """

    instance_id: str
    backend: str

    def identity(self) -> str:
        """The exact adapter/process identity; changes whenever the backend process changes.

        Handoffs are bound to it: a handoff issued under another identity is expired."""

    def close(self) -> None:
        """Release every process and resource the adapter owns. Idempotent."""


@dataclass(frozen=True)
class CapabilityReport:
    """A backend's evidence-based status for one capability id.

    ``probe_on_use`` may accompany ``unavailable`` when the deciding evidence is a functional
    probe that an explicitly opted-in request runs (llama.cpp before its first prefill): the
    host then lets opted-in requests through to the adapter, which probes and fails closed.
    """

    status: CapabilityStatus
    detail: str
    operations: tuple[str, ...] | None = None
    probe_on_use: bool = False


@dataclass(frozen=True)
class AdapterFactory:
    """Offered by a plugin through ``werk_adapter_factories``.

    ``accepts(model)`` says whether this backend can serve a model manifest (``None``
    means no model was selected); ``create(config, model)`` builds the adapter.
    ``capabilities`` declares the capability ids this backend's adapters report on (their
    statuses come from ``werk_capabilities`` at run time); ``werk plugins`` flags a declared
    or reported id that is not a :class:`~werk_host.protocol.CapabilityId`.
    ``validate_options(options)``, when given, checks a deployment instance's profile
    ``options`` when ``werk serve`` starts, before anything runs: it raises :class:`ValueError`
    with a one-line message naming the option at fault (an unknown name, a bad value);
    without it the options are handed to ``create`` unchecked (docs/plugin-hooks.md).
    ``memory_estimate(config, model)``, when given, says what an instance of ``model`` created
    with ``config`` would need beyond its model files (a :class:`MemoryEstimate`, or ``None``
    when it cannot tell), without starting anything: the host's residency admission uses it
    before the instance's first start (docs/deployments.md, "Memory estimate").
    """

    backend: str
    accepts: Callable[[ModelManifest | None], bool]
    create: Callable[[HostConfig, ModelManifest | None], Adapter]
    description: str = ""
    capabilities: tuple[CapabilityId, ...] = ()
    validate_options: Callable[[Mapping[str, JsonValue]], None] | None = None
    memory_estimate: Callable[[HostConfig, ModelManifest], MemoryEstimate | None] | None = None
    #: The owning plugin's name. A plugin leaves it out: the host fills in the entry-point name
    #: of the plugin whose ``werk_adapter_factories`` returned the factory. Given, it only
    #: asserts that name; a mismatch fails the plugin at load (docs/plugin-hooks.md).
    plugin_name: str | None = field(default=None, kw_only=True)

    @property
    def owner(self) -> str:
        """The owning plugin's name, as the host filled it in (``""`` on a factory no host saw)."""
        return self.plugin_name or ""


#: The statuses a :class:`DoctorCheck` may have (docs/cli.md, "werk doctor").
DOCTOR_STATUSES = ("ok", "warn", "fail")


@dataclass(frozen=True)
class DoctorCheck:
    """One finding of ``werk doctor``, offered by a plugin through ``werk_doctor_checks``.

    ``name`` is short and stable (``llamacpp.llama-server``); ``status`` is ``ok`` (works),
    ``warn`` (works partly, or not on this machine by design) or ``fail`` (cannot work as
    configured); ``detail`` says what was found (a version, a path the user configured), and
    ``fix`` what to do about a ``warn``/``fail``: a command to run or a setting to change.
    """

    name: str
    status: str
    detail: str
    fix: str | None = None

    def __post_init__(self) -> None:
        if self.status not in DOCTOR_STATUSES:
            raise ValueError(f"a doctor check's status is one of {', '.join(DOCTOR_STATUSES)}, not {self.status!r}")

    def as_dict(self) -> dict[str, str | None]:
        return {"name": self.name, "status": self.status, "detail": self.detail, "fix": self.fix}


@dataclass(frozen=True)
class PrefillWork:
    """What the host asks a backend to prefill. ``model_id`` is the installed model name."""

    model_id: str
    input: TextInput | MessagesInput
    want_snapshot: bool


@dataclass
class PrefilledState:
    """A backend's prefilled state.

    ``handle`` is opaque to the host. ``compat_key`` is the complete producer compatibility
    key (every dimension a string). ``snapshot_capable`` says whether ``werk_snapshot``
    can produce a disk-persistable snapshot of this state. ``volatile_tier`` is the live tier
    the backend can retain the state in as a named volatile state, or ``None``.
    """

    handle: object
    prompt_tokens: int
    compat_key: dict[str, str]
    snapshot_capable: bool
    volatile_tier: Tier | None = None
    bytes: int | None = None
    adapter_meta: JsonObject = field(default_factory=dict)


@dataclass(frozen=True)
class Snapshot:
    """An opaque snapshot: ``chunks`` yields bounded byte chunks; ``close`` frees temp files."""

    chunks: Iterable[bytes]
    size: int | None
    close: Callable[[], None]
    adapter_meta: JsonObject = field(default_factory=dict)


#: Opens the verified opaque payload of a stored state (integrity checked before yielding).
PayloadOpener = Callable[[], AbstractContextManager[BinaryIO]]


@dataclass(frozen=True)
class StoredStateRef:
    """A stored state the backend may need to restore before decoding."""

    state_id: str
    compat_key: dict[str, str]
    prompt_tokens: int | None
    bytes: int | None
    adapter_meta: JsonObject
    open_payload: PayloadOpener


@dataclass(frozen=True)
class DecodeOptions:
    max_tokens: int
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class DecodeWork:
    """Decode from a handed-off state: a live ``handle`` when the backend still holds one,
    else ``stored`` to restore from (a backend restores only from the verified payload)."""

    handle: object | None
    stored: StoredStateRef | None
    options: DecodeOptions


@dataclass
class DecodeOutput:
    text: str
    completion_tokens: int
    finish_reason: str
    next_state: PrefilledState | None = None


@dataclass(frozen=True)
class MoveWork:
    state: StoredStateRef
    action: str
    target_tier: Tier | None
    dry_run: bool


@dataclass(frozen=True)
class MoveOutput:
    tier: Tier
    changed: bool
    delete_stored: bool = False


@dataclass(frozen=True)
class ImageWork:
    """One image generation for a media backend (docs/media.md, "The media seam"):
    ``request`` validated (its ``seed`` concrete, its ``steps`` and ``sampler`` filled from the
    adapter's :class:`~werk_host.protocol.media.ImageLimits`), ``progress(step, steps)`` to
    call after each denoising step, and ``cancelled()``, which the backend polls at each step:
    once it is true the backend stops and raises ``WerkError(CONFLICT, "cancelled")``."""

    request: ImageRequest
    progress: Callable[[int, int], None]
    cancelled: Callable[[], bool]


@dataclass(frozen=True)
class SpeechWork:
    """One speech synthesis for a speech backend (docs/media.md, "Speech"): ``request``
    validated against the adapter's :class:`~werk_host.protocol.speech.SpeechLimits` (its
    ``seed``, ``voice`` and ``response_format`` concrete), ``progress(step, steps)`` to call as
    the synthesis advances (where the engine can tell), and ``cancelled()``, which the backend
    polls: once it is true the backend stops and raises ``WerkError(CONFLICT, "cancelled")``."""

    request: SpeechRequest
    progress: Callable[[int, int], None]
    cancelled: Callable[[], bool]


@dataclass(frozen=True)
class EmbeddingWork:
    """One batch for an embedding backend (docs/embeddings.md): ``inputs`` (strings or token-id
    lists), at most the adapter's ``max_batch_inputs``, each within its ``max_input_tokens``
    (the host checked and, where asked, truncated them), and ``cancelled()``, true once the
    client has gone."""

    inputs: list[EmbedInput]
    cancelled: Callable[[], bool]


@dataclass(frozen=True)
class RerankWork:
    """One rerank for a reranking backend (docs/embeddings.md): ``query`` and ``documents``,
    each pair within the adapter's ``max_input_tokens``, and ``cancelled()``."""

    query: str
    documents: list[str]
    cancelled: Callable[[], bool]


@runtime_checkable
class Pumpable(Protocol):
    """The upstream socket behind a relayed body that one event loop may drive instead of a
    thread per stream (docs/operations.md, "Where relay time goes"; werk_host/pump.py).

    While :meth:`pumped` is on, the body never blocks: when the socket has nothing, it yields
    ``b""`` (wait until :meth:`fileno` is readable and ask again). Every layer that wraps such a
    body and passes ``b""`` on may pass its ``source`` on too; one that does not drops it, and
    its body is read by its thread as before."""

    #: The longest silence of the upstream between two reads, in seconds.
    idle_s: float

    def fileno(self) -> int:
        """The upstream socket to wait on."""
        ...

    def pumped(self, on: bool) -> None:
        """Reads that yield ``b""`` instead of blocking (``on``), or blocking reads again."""
        ...

    def expire(self) -> None:
        """The upstream was silent for ``idle_s``: the body's next read fails as a cut answer."""
        ...


@dataclass
class InferenceResponse:
    """A proxied inference response: status, headers and a streamed body.

    ``body`` yields raw bytes as they arrive; ``close`` cancels the upstream request.
    ``source``: the upstream socket an event loop may drive the body from (:class:`Pumpable`);
    ``None`` for a body that only its thread reads.
    """

    status: int
    headers: dict[str, str]
    body: Iterator[bytes]
    close: Callable[[], None]
    source: Pumpable | None = None


#: The WSGI environ key of the serving layer's pump, when it has one: ``pump(body, source)``
#: relays ``body`` to the client from one event loop and returns ``True`` when nothing is left
#: to send (the body ended or the client left) or ``False`` when the request's own thread must
#: go on (the client reads slowly; ``source`` blocks again). An exception of the body is raised
#: in the caller's thread (werk_host/pump.py).
PUMP_ENVIRON = "werk.pump"


@runtime_checkable
class SessionSlot(Protocol):
    """One backend process's session slot, as ``werk chat``/``werk run`` use it (the optional
    ``werk_session_slot`` seam; docs/chat.md, "Native snapshots"). The host owns every
    file and every rule around it (:mod:`werk_host.chat.native`); the backend only moves bytes
    into and out of its session slot, serves requests on that slot and reads its own counters."""

    def session_key(self) -> dict[str, str]:
        """Every dimension that decides whether a snapshot taken now can be restored into another
        process of this backend: model files, runtime binary and libraries, environment,
        effective launch arguments, snapshot layout; each a string, compared for exact equality.
        Never a per-process value: a snapshot is meant to survive restarts. Raises
        ``unavailable`` when the evidence cannot be established (then nothing is restored)."""
        ...

    def chat(self, request: JsonObject) -> InferenceResponse:
        """Serve an OpenAI chat-completions body on the session slot (the slot :meth:`restore`
        fills and :meth:`save` saves); otherwise the contract of ``werk_chat_completion``. The
        host streams (``stream: true``) and asks for usage (``stream_options.include_usage``)."""
        ...

    def restore(self, stored: StoredStateRef) -> int:
        """Load a snapshot into the idle session slot; returns the number of tokens it holds.

        Read it only through ``stored.open_payload()``, which yields a real file (``fileno()``)
        whose size and SHA-256 the host has checked on that very descriptor; ``stored.compat_key``
        is the compatibility key it was saved under and ``stored.adapter_meta`` what the snapshot's
        ``adapter_meta`` said. Requires the backend's exact restore acknowledgements. On any
        failure the slot is cleared before ``corrupt_state`` (or ``unavailable``) is raised."""
        ...

    def save(self) -> Snapshot:
        """The session slot's current state as an opaque snapshot in bounded chunks, its save
        acknowledgements checked. The host calls it only after a complete, successful response."""
        ...

    def cached_tokens(self, usage_event: JsonObject) -> int | None:
        """The prompt tokens the backend reports it took from its cache for the response whose
        final usage event (the stream's event carrying ``usage``) is ``usage_event``; ``None``
        when the count is missing or inconsistent with the backend's other counters. Never an
        estimate."""
        ...


@dataclass(frozen=True)
class SavedPrompt:
    """What :meth:`PromptCacheLease.save` took from its slot: the opaque payload and the token
    ids the slot held (prompt and answer), from which the host derives the entry's prefix
    fingerprints (docs/prompt-cache.md)."""

    snapshot: Snapshot
    tokens: tuple[int, ...]


@runtime_checkable
class PromptCacheLease(Protocol):
    """One backend slot held for one ordinary request of one owner (the optional
    ``werk_prompt_cache`` seam; docs/prompt-cache.md). Held until :meth:`release`."""

    #: how many leading tokens of the request's prompt the slot already holds for this owner
    #: (``0`` when it held another owner's, which the backend erased before leasing it)
    held: int

    def restore(self, stored: StoredStateRef) -> int:
        """Load a saved entry into the leased slot; returns how many leading tokens of the
        request's prompt the slot then holds. The payload is read only through
        ``stored.open_payload()`` (size and SHA-256 checked by the host on that descriptor);
        ``stored.compat_key`` must equal :meth:`PromptCache.cache_key` exactly and the backend's
        restore acknowledgement must be exact, else ``incompatible_state``/``corrupt_state``
        with the slot cleared first."""
        ...

    def forward(self, path: str, request: JsonObject) -> InferenceResponse:
        """Serve ``/v1/chat/completions`` or ``/v1/completions`` on the leased slot, otherwise
        as ``werk_chat_completion``/``werk_text_completion`` would. Closing the response does
        not release the lease."""
        ...

    def cached_tokens(self, usage_event: JsonObject) -> int | None:
        """As :meth:`SessionSlot.cached_tokens`: the backend's own, consistent cache count for
        the response whose final ``usage`` (and the backend's counters beside it) is
        ``usage_event``; ``None`` when missing or inconsistent."""
        ...

    def save(self) -> SavedPrompt | None:
        """The leased slot's state after a complete, successful response (the host calls it
        before :meth:`release`); ``None`` when the slot holds nothing worth saving."""
        ...

    def release(self) -> None:
        """Give the slot back. Idempotent."""
        ...


@runtime_checkable
class PromptCache(Protocol):
    """A backend's slots as automatic prompt caches for ordinary requests (the optional
    ``werk_prompt_cache`` seam; docs/prompt-cache.md). The host owns the store, the per-owner
    fingerprints, the budget and every rule; the backend keeps each slot's owner (an opaque
    string the host gives it) so that no owner's request ever reuses another's cached prefix,
    and moves slot contents in and out."""

    def cache_key(self) -> dict[str, str]:
        """The exact compatibility key an entry saved now is restored under (runtime binary,
        KV-affecting arguments, model identity and files, cache layout); strings compared for
        equality. Raises ``unavailable`` when it cannot be established."""
        ...

    def unavailable_reason(self) -> str | None:
        """Why restored prefixes cannot be reused by this running backend (e.g. a
        sliding-window cache kept partially), from evidence; ``None`` while nothing says so.
        The host then saves and restores nothing and reports the reason."""
        ...

    def prompt_tokens(self, path: str, request: JsonObject) -> list[int] | None:
        """The token ids the backend will evaluate for ``request`` on ``path``; ``None`` when it
        cannot tell (then nothing is restored or saved for the request)."""
        ...

    def lease(self, owner: str, tokens: list[int] | None) -> PromptCacheLease:
        """A slot for one request of ``owner``: a free one already holding the longest prefix of
        ``tokens`` for that owner when there is one, else another free slot, cleared first when
        it held another owner's tokens. Waits within the backend's slot bound."""
        ...

    def invalidate(self, reason: str) -> None:
        """Evidence that a restore was not reused (the host saw the backend's counters): the
        backend decides whether the mechanism stays usable (:meth:`unavailable_reason`)."""
        ...


#: Around a ``/v1`` inference hook call, the HTTP layer sets this to a callable that answers
#: whether the client has gone away (``None``: the server cannot tell). A hook that waits on
#: its backend before the first response byte should poll it and, once it is true, close the
#: upstream request (so the backend stops working for nobody) and raise.
client_disconnected: ContextVar[Callable[[], bool] | None] = ContextVar("werk_client_disconnected", default=None)

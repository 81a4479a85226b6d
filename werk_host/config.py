"""Host configuration assembled by ``werk serve`` (or a test) and handed to every layer."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from werk_host.protocol.pd import PersistenceMode, ReusePolicy


@dataclass(frozen=True)
class PersistenceDefaults:
    """Server-side Prefill defaults (``werk serve --persistence`` and its granular flags).

    They apply only to *absent* top-level members of a prefill request.
    """

    mode: PersistenceMode = PersistenceMode.AUTO
    reuse: ReusePolicy = ReusePolicy.PREFER
    ttl_seconds: int | None = None
    pin: bool = False


@dataclass(frozen=True)
class ServerLimits:
    """How ``werk serve``'s HTTP server (waitress) holds connections (docs/operations.md, "Connections").

    Idle connections cannot starve real work: up to ``connection_limit`` sockets are served at
    once; a connection with no request in progress for ``channel_timeout`` seconds is closed,
    checked every ``cleanup_interval`` seconds. A connection whose request is still running
    (a long generation, a stream) is never closed for idleness. Slow ones cannot either: a
    request not received whole within ``request_read_timeout`` seconds of its first byte is
    closed (408) at the next sweep, and at the limit the server closes connections that hold no
    request in service to accept new ones (werk_host/serving.py).
    """

    threads: int = 32
    connection_limit: int = 1000
    channel_timeout: int = 15
    cleanup_interval: int = 5
    #: Seconds a request may take to arrive whole (headers and body) from its first byte,
    #: however steadily it trickles (docs/operations.md, "Connections"; werk_host/serving.py).
    request_read_timeout: int = 20
    #: Inference concurrency (docs/operations.md, "Inference concurrency"): generation requests
    #: running or queued host-wide (``None``: ``threads - max(2, threads // 4)``; it must stay
    #: below ``threads``) and per key (``None``: half of the host-wide bound); per instance, the
    #: capacity when the backend reports none, the queue (``None``: the per-key bound), the longest
    #: wait in it, and the ``Retry-After`` of a refusal.
    inference_max: int | None = None
    inference_per_key: int | None = None
    inference_slots: int = 4
    inference_queue: int | None = None
    inference_wait_s: float = 30.0
    inference_retry_after_s: int = 2


@dataclass(frozen=True)
class BackendBounds:
    """How long Werk waits for a backend (docs/operations.md, "Backend failures").

    ``call_s`` bounds each short call Werk makes itself (token counts, slot and health reads,
    inventory observations; ``werk serve --backend-timeout``). ``first_byte_s`` bounds the wait
    for the response of a relayed inference request (a non-streamed answer arrives whole, so this
    covers its generation; ``--backend-first-byte-timeout``), and ``idle_s`` the silence between
    two reads of a relayed response while it streams (``--backend-idle-timeout``). A bound that
    runs out is a retryable ``unavailable`` (503) before the answer began, and an error event at
    the end of a stream after.
    """

    call_s: float = 30.0
    first_byte_s: float = 600.0
    idle_s: float = 120.0


@dataclass(frozen=True)
class StoreBounds:
    """How much the runtime-state store may hold (docs/states.md, "Quotas"; ``werk serve
    --store-max-states``, ``--store-max-bytes``, ``--store-max-states-per-key``,
    ``--store-max-bytes-per-key``).

    States and bytes (payload plus metadata) store-wide, and per API key; ``None`` is the
    store's default: 4096 states and 64 GiB store-wide, and per key a quarter of the
    store-wide bound. A commit over a bound is a retryable 429 ``resource_exhausted``.
    """

    max_states: int | None = None
    max_bytes: int | None = None
    max_states_per_key: int | None = None
    max_bytes_per_key: int | None = None


@dataclass(frozen=True)
class HostConfig:
    home: Path
    api_keys: tuple[str, ...] = ()
    #: keys of operators: accepted like ``api_keys``, and they may change residency
    #: (werk_host/service/principals.py)
    operator_api_keys: tuple[str, ...] = ()
    host: str = "127.0.0.1"
    port: int = 11434
    #: ``--allowed-hosts`` / ``--allowed-origins``: more ``Host`` names and cross origins a
    #: browser may use (docs/operations.md, "Browser safety"; werk_host/http/browser.py)
    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()
    limits: ServerLimits = field(default_factory=ServerLimits)
    #: The model to serve (``--model``); more with ``models``. Each is one instance (id = model name).
    model: str | None = None
    models: tuple[str, ...] = ()
    #: A deployment profile (``--profile``); without one, ``WERK_HOME/deployments.toml`` when present.
    profile: Path | None = None
    #: ``--max-loaded``: instances loaded at once host-wide, replacing the profile's
    #: ``[residency] max_loaded`` (docs/deployments.md, "Residency limits"); ``None``: the profile's
    max_loaded: int | None = None
    #: ``--prompt-cache-budget``: each instance's prompt-cache disk budget in bytes unless its
    #: profile entry says ``prompt_cache`` (``0``: off; ``None``: the default; docs/prompt-cache.md)
    prompt_cache_budget: int | None = None
    persistence: PersistenceDefaults | None = None
    #: Backend-specific settings keyed by plugin name (e.g. ``{"llamacpp": {"llama_server": ...}}``).
    backend_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: ``--warmup-tokens``: 0 (default) asks native servers to skip their synthetic warmup run;
    #: a positive value enables it where the runtime offers it (docs/chat.md, "Warmup").
    warmup_tokens: int = 0
    backend_bounds: BackendBounds = field(default_factory=BackendBounds)
    #: ``--model-cache-release``: ``auto``, ``on`` or ``off`` (docs/operations.md, "Model file
    #: cache"); ``None``: ``WERK_MODEL_CACHE_RELEASE``, else ``auto``. A profile entry's own
    #: ``model_cache_release`` wins for that instance.
    model_cache_release: str | None = None
    store_bounds: StoreBounds = field(default_factory=StoreBounds)

    def served_models(self) -> tuple[str, ...]:
        """``model`` then ``models``, without repeats: the ``--model`` shorthand's instances."""
        return tuple(dict.fromkeys(m for m in (self.model, *self.models) if m))

    def __repr__(self) -> str:  # never show keys
        return (
            f"HostConfig(home={str(self.home)!r}, api_keys=<{len(self.api_keys)} configured>, "
            f"operator_api_keys=<{len(self.operator_api_keys)} configured>, "
            f"host={self.host!r}, port={self.port}, models={self.served_models()!r}, profile={self.profile!r})"
        )

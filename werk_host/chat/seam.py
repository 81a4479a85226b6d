"""The optional backend seam for native session snapshots (docs/chat.md, "Native snapshots").

A backend that can save the KV state of one conversation to a file and load it into a later
process of itself offers a :class:`SessionSnapshots` object through the
``werk_session_snapshots`` hook. The host owns every file and every rule around it: private
paths, SHA-256 and size checks, the ``capability.json`` receipt, when a restore happens and what
counts as observed reuse (:mod:`werk_host.chat.native`). The backend only moves bytes into and
out of its session slot, serves requests on that slot and reads its own counters.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from werk_host.backend import InferenceResponse, JsonObject, Snapshot, StoredStateRef


@runtime_checkable
class SessionSnapshots(Protocol):
    """One backend process's session slot, as ``werk chat``/``werk run`` use it."""

    def envelope(self) -> dict[str, str]:
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
        whose size and SHA-256 the host has checked on that very descriptor; ``stored.envelope``
        is the envelope it was saved under and ``stored.adapter_meta`` what the snapshot's
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


__all__ = ["SessionSnapshots"]

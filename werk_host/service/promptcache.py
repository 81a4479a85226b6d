"""Automatic prompt caches for ordinary requests (docs/prompt-cache.md).

An instance whose backend implements ``werk_prompt_cache`` (:class:`~werk_host.seam.PromptCache`)
serves its ordinary ``/v1`` chat and text requests — and so the Anthropic, Ollama and Responses
routes, which call them — through :meth:`PromptCaches.forward`. Contracts:

* **Per key, never shared.** Every lease names the requesting principal as its owner: the
  backend erases a slot that held another owner's tokens before it serves. Entries live in a
  store of their own per instance (``WERK_HOME/prompt-cache/<instance>/``: the runtime-state
  store's atomic commit, SHA-256, owner-only files and quarantine), under the requesting
  principal; fingerprints are keyed by the principal (:meth:`Authenticator.prompt_fingerprint`)
  and the exact compatibility key, so two keys' identical documents never match.
* **Prefix fingerprints at block boundaries.** Each :data:`BLOCK_TOKENS` tokens of a saved slot's
  tokens end a chained SHA-256; an entry records the keyed fingerprint of every boundary (at
  most :data:`MAX_BLOCKS`). A request's longest saved prefix is the entry sharing most leading
  fingerprints with the request's prompt tokens.
* **Threshold.** Prompts under :data:`MIN_TOKENS` tokens are neither saved nor restored.
* **Restore before the request**, only when the best entry holds at least one block more than
  the leased slot already does, and only while the backend reports no reason against reuse:
  the payload's size and SHA-256 are checked on the descriptor the backend reads; a corrupt
  entry is quarantined by the store, an incompatible or refused one deleted, and the request
  then goes on cold.
* **Verified, never claimed.** A restore counts as a hit only when the backend's own counters
  on that request (:meth:`PromptCacheLease.cached_tokens`) show more cached tokens than the
  slot held before it; otherwise the entry is deleted, the backend told
  (:meth:`PromptCache.invalidate`) and the restore counted as a miss.
* **Saved after the answer**, off the answer's path: after a complete, successful response the
  slot is saved (the lease is held for that save only) and the payload committed by one
  background thread, unless a saved entry already holds the whole prompt (every block, and at
  least as many tokens). Entries of the same key whose blocks the new entry extends (or equals)
  are deleted (it serves them all), pinned ones excepted: a conversation keeps one entry, its
  latest turn. Before each
  commit, least-recently-used entries of the instance are evicted until the new one fits the
  budget (pinned or open ones never), so the budget is never exceeded; an entry larger than
  the budget is not saved. :meth:`PromptCaches.close` waits (bounded) for commits in flight.
* **Counters** per instance in :class:`~werk_host.service.counters.ChatStats`:
  ``prompt_cache_hits``/``misses``/``restored_tokens``/``saves`` and the milliseconds spent
  saving and restoring; :meth:`PromptCaches.disk_bytes` per instance for ``/metrics``.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import logging
import re
import threading
import time
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from werk_host.config import HostConfig
from werk_host.errors import ErrorCode, WerkError
from werk_host.hooks import BackendHooks
from werk_host.protocol import CapabilityStatus
from werk_host.seam import (
    Adapter,
    CapabilityReport,
    InferenceResponse,
    JsonObject,
    PromptCache,
    PromptCacheLease,
    SavedPrompt,
    StoredStateRef,
)
from werk_host.service.counters import ChatStats
from werk_host.service.fleet import Fleet
from werk_host.service.principals import Authenticator, Principal
from werk_host.service.tail import Tail
from werk_host.store import StateStore
from werk_host.store.records import StateRecord

log = logging.getLogger(__name__)

#: Tokens per fingerprinted block.
BLOCK_TOKENS: Final = 256
#: The shortest prompt (tokens) that is saved or restored.
MIN_TOKENS: Final = 1024
#: The most block fingerprints one entry records (longer entries match on their first ones).
MAX_BLOCKS: Final = 512
#: The default disk budget of one instance's prompt caches.
DEFAULT_BUDGET_BYTES: Final = 4 << 30
#: How long :meth:`PromptCaches.close` waits for commits in flight.
DRAIN_S: Final = 30.0
_FP_CHARS: Final = 32
_STORE_BOUND: Final = 1 << 50
_TAIL: Final = 16384
_OBJECT = {name: re.compile(rb'"' + name.encode() + rb'"\s*:\s*\{') for name in ("usage", "timings")}
_SAFE_LABEL = re.compile(r"[A-Za-z0-9._-]{1,64}")


def usage_event(tail: bytes) -> JsonObject | None:
    """The last ``usage`` object of a relayed answer's tail (and ``timings`` beside it, as
    llama-server sends them), as one event; ``None`` without a ``usage``."""
    event: JsonObject = {}
    decoder = json.JSONDecoder()
    text = tail.decode("utf-8", "replace")
    for name, pattern in _OBJECT.items():
        found = list(pattern.finditer(tail))
        if not found:
            continue
        start = len(tail[: found[-1].end() - 1].decode("utf-8", "replace"))
        try:
            value, _ = decoder.raw_decode(text, start)
        except ValueError:
            continue
        if isinstance(value, dict):
            event[name] = value
    return event if "usage" in event else None


def block_digests(tokens: list[int]) -> list[bytes]:
    """The chained SHA-256 at every :data:`BLOCK_TOKENS` boundary of ``tokens`` (at most
    :data:`MAX_BLOCKS`)."""
    out: list[bytes] = []
    chain = b""
    for end in range(BLOCK_TOKENS, min(len(tokens), BLOCK_TOKENS * MAX_BLOCKS) + 1, BLOCK_TOKENS):
        chain = hashlib.sha256(chain + array("q", tokens[end - BLOCK_TOKENS : end]).tobytes()).digest()
        out.append(chain)
    return out


def leading_equal(a: list[Any], b: list[Any]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@dataclass
class _Request:
    """One request's prompt-cache bookkeeping (from lease to close)."""

    principal: Principal
    label: str
    cache: PromptCache
    lease: PromptCacheLease
    key: dict[str, str]
    fingerprints: list[str]
    tokens: int
    held: int
    restored: StateRecord | None = None
    held_after: int = 0  # leading prompt tokens the slot held after the restore
    covered: int = 0  # blocks of the prompt a saved entry already holds
    whole: bool = False  # a saved entry already holds the whole prompt (nothing to save)
    missed: bool = False  # counted as a miss already (a refused restore)


class PromptCaches:
    """The prompt caches of every instance of one host (see the module docstring)."""

    def __init__(
        self,
        home: Path,
        auth: Authenticator,
        hooks: BackendHooks,
        stats: ChatStats,
        budget: Callable[[str], int],
    ) -> None:
        self.home = home
        self.auth = auth
        self.hooks = hooks
        self.stats = stats
        self.budget = budget
        self._stores: dict[str, StateStore] = {}
        self._lock = threading.Lock()
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="werk-prompt-cache")
        self._pending: set[concurrent.futures.Future[None]] = set()
        #: per instance: a count bumped by every request and every prewarm (a prewarm whose
        #: count moved meanwhile yields to the request)
        self._served: dict[str, int] = {}

    # -- stores ---------------------------------------------------------------------------
    @staticmethod
    def store_name(label: str) -> str:
        """The name of instance ``label``'s store: the label, or ``i-`` and a digest of it."""
        if _SAFE_LABEL.fullmatch(label) and label not in (".", ".."):
            return label
        return "i-" + hashlib.sha256(label.encode()).hexdigest()[:16]

    def store(self, label: str) -> StateStore:
        """The prompt-cache store of instance ``label``."""
        return self.store_named(self.store_name(label))

    def store_named(self, name: str) -> StateStore:
        """The store named ``name`` (:meth:`store_name`), one handle per name."""
        with self._lock:
            store = self._stores.get(name)
            if store is None:
                # the budget is the instance's, kept by eviction before each commit (_make_room);
                # the store's own bounds only stand guard far above it
                store = StateStore(
                    self.home / "prompt-cache" / name,
                    max_bytes=_STORE_BOUND,
                    max_bytes_per_key=_STORE_BOUND,
                    max_states=100_000,
                    max_states_per_key=100_000,
                )
                self._stores[name] = store
            return store

    def disk_bytes(self) -> dict[str, int]:
        """Payload bytes of the committed entries of every instance store on disk."""
        return {
            name: sum(e.bytes or 0 for e in self.store_named(name).inventory() if e.kind == "state")
            for name in store_names(self.home)
        }

    def report(self, adapter: Adapter | None, label: str) -> CapabilityReport:
        """``runtime.state.prompt_cache`` for the instance ``label`` running ``adapter``, from
        evidence: the backend's seam, the budget, the backend's reason against reuse, and the
        restores its counters confirmed on this host."""
        if adapter is None:
            return CapabilityReport(CapabilityStatus.UNAVAILABLE, "no backend process runs for this instance yet")
        cache = self.hooks.prompt_cache(adapter)
        if cache is None:
            return CapabilityReport(
                CapabilityStatus.UNSUPPORTED,
                "the backend keeps its prefix cache itself (runtime.state.prefix_cache); Werk saves none of it",
            )
        if self.budget(label) <= 0:
            return CapabilityReport(
                CapabilityStatus.UNAVAILABLE, "turned off: this instance's prompt-cache budget is 0"
            )
        reason = cache.unavailable_reason()
        if reason is not None:
            return CapabilityReport(CapabilityStatus.UNAVAILABLE, reason)
        counts = self.stats.per_instance().get(label)
        hits, misses = (counts.prompt_cache_hits, counts.prompt_cache_misses) if counts is not None else (0, 0)
        return CapabilityReport(
            CapabilityStatus.EXPERIMENTAL,
            f"prompts of {MIN_TOKENS}+ tokens are saved per key after each answer and restored when the "
            f"backend's counters confirm the reuse ({hits} confirmed, {misses} missed on this host)",
        )

    # -- serving --------------------------------------------------------------------------
    def forward(
        self, principal: Principal, label: str, adapter: Adapter, path: str, body: JsonObject
    ) -> InferenceResponse | None:
        """Serve ``body`` on ``path`` through the adapter's prompt cache; ``None`` when the
        backend has none (the caller relays as usual)."""
        cache = self.hooks.prompt_cache(adapter)
        if cache is None:
            return None
        with self._lock:
            self._served[label] = self._served.get(label, 0) + 1
        budget = self.budget(label)
        tokens = None
        if budget > 0 and _long_enough(body) and cache.unavailable_reason() is None:
            tokens = cache.prompt_tokens(path, body)
            if tokens is not None and len(tokens) < MIN_TOKENS:
                tokens = None
        lease = cache.lease(principal.id, tokens)
        try:
            work = None
            if tokens is not None:
                key = cache.cache_key()
                work = _Request(
                    principal,
                    label,
                    cache,
                    lease,
                    key,
                    self._fingerprints(principal, key, tokens),
                    len(tokens),
                    lease.held,
                )
                self._restore(work)
            response = lease.forward(path, body)
        except BaseException:
            lease.release()
            raise
        return self._finished(response, lease, work)

    def prewarm(self, label: str, adapter: Adapter) -> None:
        """A process of instance ``label`` became ready: restore, in the background, the
        instance's most recently used entry into a slot booked for its key, so that key's next
        request finds its prefix there (docs/prompt-cache.md, "Warm start"). Skipped when a
        request reached the instance first, the budget is 0 or the backend has no prompt cache."""
        if self.budget(label) <= 0 or self.hooks.prompt_cache(adapter) is None:
            return
        with self._lock:
            self._served[label] = served = self._served.get(label, 0) + 1
        future = self._pool.submit(self._prewarm, label, adapter, served)
        with self._lock:
            self._pending.add(future)
        future.add_done_callback(self._done)

    def _prewarm(self, label: str, adapter: Adapter, served: int) -> None:
        cache = self.hooks.prompt_cache(adapter)
        if cache is None or cache.unavailable_reason() is not None:
            return
        key, store = cache.cache_key(), self.store(label)
        newest: tuple[int, str, StateRecord] | None = None
        for principal in store_principals(store):
            after = None
            while True:
                page, after = store.list_states(principal, after=after)
                for record in page:
                    seen = (record.last_accessed_unix_ms, principal, record)
                    if record.compat_key == key and (newest is None or seen[0] > newest[0]):
                        newest = seen
                if after is None:
                    break
        with self._lock:
            if newest is None or self._served.get(label) != served:
                return  # nothing saved, or a request came first: its own restore decides
        _, principal, record = newest
        lease = cache.lease(principal, None)
        started = time.perf_counter()
        try:
            lease.restore(self._stored(store, principal, record))
            self.stats.add(instance=label, prompt_cache_prewarms=1)
        except WerkError as err:
            log.info("instance %s: the most recent prompt cache entry was not prewarmed (%s)", label, err.code)
        finally:
            lease.release()
            self.stats.add(instance=label, prompt_cache_restore_ms=round((time.perf_counter() - started) * 1000))

    @staticmethod
    def _stored(store: StateStore, principal: str, record: StateRecord) -> StoredStateRef:
        sid = record.id
        return StoredStateRef(
            state_id=sid,
            compat_key=dict(record.compat_key),
            prompt_tokens=record.prompt_tokens,
            bytes=record.bytes,
            adapter_meta=dict(record.adapter_meta),
            open_payload=lambda: store.open_payload(principal, sid),
        )

    def _fingerprints(self, principal: Principal, key: dict[str, str], tokens: list[int]) -> list[str]:
        key_digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).digest()
        return [
            self.auth.prompt_fingerprint(principal, b"prompt-cache\0" + key_digest + chain)[:_FP_CHARS]
            for chain in block_digests(tokens)
        ]

    def _entries(self, work: _Request) -> list[StateRecord]:
        store, after = self.store(work.label), None
        out: list[StateRecord] = []
        while True:
            page, after = store.list_states(work.principal.id, after=after)
            out.extend(r for r in page if r.compat_key == work.key)
            if after is None:
                return out

    def _restore(self, work: _Request) -> None:
        best, common = None, 0
        for record in self._entries(work):
            blocks = record.adapter_meta.get("blocks")
            shared = leading_equal(blocks, work.fingerprints) if isinstance(blocks, list) else 0
            if shared > common or (
                shared == common and best is not None and record.created_unix_ms > best.created_unix_ms
            ):
                best, common = record, shared
        work.covered = common
        work.whole = best is not None and common == len(work.fingerprints) and (best.prompt_tokens or 0) >= work.tokens
        if best is None or common * BLOCK_TOKENS < work.held + BLOCK_TOKENS:
            return
        store, pid, sid = self.store(work.label), work.principal.id, best.id
        stored = self._stored(store, pid, best)
        started = time.perf_counter()
        try:
            work.held_after = work.lease.restore(stored)
        except WerkError as err:
            if err.code not in (ErrorCode.CORRUPT_STATE, ErrorCode.INCOMPATIBLE_STATE, ErrorCode.NOT_FOUND):
                raise
            log.warning(
                "prompt cache entry of instance %s not restored (%s); the request runs cold", work.label, err.code
            )
            if err.code is not ErrorCode.CORRUPT_STATE:  # the store quarantined a corrupt one itself
                store.delete(pid, sid)
            self.stats.add(instance=work.label, prompt_cache_misses=1)
            work.covered, work.whole, work.missed = 0, False, True
            return
        finally:
            self.stats.add(instance=work.label, prompt_cache_restore_ms=round((time.perf_counter() - started) * 1000))
        work.restored = best

    def _finished(
        self, response: InferenceResponse, lease: PromptCacheLease, work: _Request | None
    ) -> InferenceResponse:
        """``response`` that, once closed, checks the backend's counters, saves and releases."""
        state: dict[str, Any] = {"tail": b"", "complete": False, "closed": False}

        def body() -> Iterator[bytes]:
            tail = Tail(_TAIL)
            for chunk in response.body:
                tail.add(chunk)
                yield chunk
            state["tail"], state["complete"] = tail.value(), True

        def close() -> None:
            if state["closed"]:
                return
            state["closed"] = True
            try:
                response.close()
            finally:
                try:
                    if work is not None and state["complete"] and response.status < 400:
                        self._settle(work, state["tail"])
                finally:
                    lease.release()

        source = response.source  # the body passes b"" on (werk_host/seam.py, Pumpable)
        return InferenceResponse(response.status, response.headers, body(), close, source)

    def _settle(self, work: _Request, tail: bytes) -> None:
        event = usage_event(tail)
        cached = work.lease.cached_tokens(event) if event is not None else None
        if work.restored is not None:
            if cached is None:  # no consistent count (e.g. the process was replaced): nothing is claimed
                pass
            elif cached > work.held:
                self.stats.add(
                    instance=work.label, prompt_cache_hits=1, prompt_cache_restored_tokens=cached - work.held
                )
            else:
                log.warning("instance %s: a restored prompt cache entry was not reused; it is deleted", work.label)
                self.stats.add(instance=work.label, prompt_cache_misses=1)
                self.store(work.label).delete(work.principal.id, work.restored.id)
                work.cache.invalidate(f"{cached} cached tokens after restoring {work.held_after}")
                return
        elif work.covered == 0 and not work.missed:
            self.stats.add(instance=work.label, prompt_cache_misses=1)
        if work.whole:
            return  # a saved entry already holds this whole prompt
        started = time.perf_counter()
        try:
            saved = work.lease.save()
        except WerkError as err:
            log.warning("instance %s: the prompt cache was not saved (%s)", work.label, err.code)
            return
        finally:
            self.stats.add(instance=work.label, prompt_cache_save_ms=round((time.perf_counter() - started) * 1000))
        if saved is None:
            return
        future = self._pool.submit(self._commit, work, saved)
        with self._lock:
            self._pending.add(future)
        future.add_done_callback(self._done)

    def _done(self, future: concurrent.futures.Future[None]) -> None:
        with self._lock:
            self._pending.discard(future)

    def _commit(self, work: _Request, saved: SavedPrompt) -> None:
        snapshot = saved.snapshot
        started = time.perf_counter()
        try:
            tokens = list(saved.tokens)
            blocks = self._fingerprints(work.principal, work.key, tokens)
            size = snapshot.size or 0
            store = self.store(work.label)
            if not blocks or size <= 0 or not self._make_room(store, size, self.budget(work.label)):
                return
            adapter_meta: dict[str, Any] = {**snapshot.adapter_meta, "blocks": blocks}
            record = store.commit(
                work.principal.id,
                model_id=work.key.get("model_identity", "model")[:200] or "model",
                backend=work.key.get("backend", "backend")[:200] or "backend",
                compat_key=work.key,
                payload=snapshot.chunks,
                prompt_fingerprint=blocks[-1],
                prompt_tokens=len(tokens),
                adapter_meta=adapter_meta,
            )
            for older in self._entries(work):
                old_blocks = older.adapter_meta.get("blocks")
                superseded = isinstance(old_blocks, list) and blocks[: len(old_blocks)] == old_blocks
                if older.id != record.id and not older.pinned and superseded:
                    store.delete(work.principal.id, older.id)
            self.stats.add(instance=work.label, prompt_cache_saves=1)
        except WerkError as err:
            log.warning("instance %s: prompt cache entry not committed (%s)", work.label, err.code)
        except Exception:
            log.exception("instance %s: prompt cache commit failed", work.label)
        finally:
            snapshot.close()
            self.stats.add(instance=work.label, prompt_cache_save_ms=round((time.perf_counter() - started) * 1000))

    def _make_room(self, store: StateStore, size: int, budget: int) -> bool:
        """Evict least-recently-used entries until ``size`` more bytes fit ``budget``; ``False``
        when they cannot (the entry alone is larger, or the rest is pinned or open)."""
        if size > budget:
            return False
        entries = [e for e in store.inventory() if e.kind == "state"]
        used = sum(e.bytes or 0 for e in entries)
        victims = sorted(
            (e for e in entries if not e.pinned and not e.active),
            key=lambda e: (e.last_accessed_unix_ms or e.created_unix_ms or 0, e.id),
        )
        for entry in victims:
            if used + size <= budget:
                break
            outcome = store.purge(ids=[entry.id])
            if outcome.removed:
                used -= entry.bytes or 0
        return used + size <= budget

    def wait(self, timeout: float = DRAIN_S) -> None:
        """Wait at most ``timeout`` seconds for the commits in flight now."""
        with self._lock:
            pending = set(self._pending)
        if pending:
            concurrent.futures.wait(pending, timeout=timeout)

    def close(self, timeout: float = DRAIN_S) -> None:
        """:meth:`wait`, then stop the committer."""
        self.wait(timeout)
        self._pool.shutdown(wait=False, cancel_futures=True)


def store_principals(store: StateStore) -> list[str]:
    """The principals with a directory in ``store`` (``p_<principal>``)."""
    try:
        names = sorted(p.name for p in store.root.iterdir() if p.is_dir() and not p.is_symlink())
    except OSError:
        return []
    return [n[2:] for n in names if n.startswith("p_")]


def store_names(home: Path) -> list[str]:
    """The instance stores under ``WERK_HOME/prompt-cache`` (no link followed)."""
    try:
        return sorted(p.name for p in (home / "prompt-cache").iterdir() if p.is_dir() and not p.is_symlink())
    except OSError:
        return []


def prompt_cache_store(home: Path, name: str) -> StateStore:
    """A read/administration handle on the instance store ``name`` (``werk cache``)."""
    return StateStore(home / "prompt-cache" / name)


def prompt_cache_budget(config: HostConfig, fleet: Fleet) -> Callable[[str], int]:
    """Each instance's prompt-cache budget by its label: its profile's ``prompt_cache``, else
    ``werk serve --prompt-cache-budget``, else :data:`DEFAULT_BUDGET_BYTES`."""
    host = DEFAULT_BUDGET_BYTES if config.prompt_cache_budget is None else config.prompt_cache_budget

    def budget(label: str) -> int:
        deployments = fleet.deployments
        instance = deployments.instances.get(label) if deployments is not None else None
        own = instance.spec.prompt_cache_bytes if instance is not None else None
        return host if own is None else own

    return budget


def _long_enough(body: JsonObject) -> bool:
    """Whether the request's text could reach :data:`MIN_TOKENS` tokens (a token is at least one
    character of the rendered prompt): short requests skip rendering and tokenizing."""
    size = 0
    for field in ("messages", "prompt"):
        value = body.get(field)
        if value is not None:
            size += len(json.dumps(value))
    return size >= MIN_TOKENS

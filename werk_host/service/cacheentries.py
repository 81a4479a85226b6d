"""One key's automatic prompt caches, for that key: list, pin, unpin, evict and prune
(``/werk/v1/prompt-caches``; docs/prompt-cache.md, "Routes").

Contracts:

* **The caller's own entries only.** Every operation reads and writes the requesting
  principal's directory of each instance store (:class:`~werk_host.service.promptcache.PromptCaches`);
  another key's entry is ``not_found``, exactly like an entry that does not exist.
* **No store is made from a request.** An entry id names an instance store that must already
  exist under ``WERK_HOME/prompt-cache`` (``not_found`` otherwise).
* **Dry runs change nothing.** A pin, unpin or evict with ``dry_run`` answers the projected
  entry; a prune is a dry run unless ``dry_run: false`` (as for named states).
* **Pinned entries stay**: the budget's eviction and the supersession by a later turn skip
  them; only an explicit evict or prune of the caller removes one.
* ``reusable`` is evidence: whether the instance's running backend's compatibility key is the
  entry's exactly; ``null`` while no process of that instance runs.
"""

from __future__ import annotations

from collections.abc import Iterator

from werk_host.errors import ErrorCode, WerkError
from werk_host.protocol import (
    PromptCacheActionKind,
    PromptCacheActionRequest,
    PromptCacheActionResult,
    PromptCacheEntry,
    PromptCacheFilterSelector,
    PromptCacheIdsSelector,
    PromptCacheList,
    PromptCacheListQuery,
    PromptCachePruneRequest,
    PruneResult,
)
from werk_host.service.fleet import Fleet
from werk_host.service.principals import Principal
from werk_host.service.promptcache import PromptCaches, store_names
from werk_host.store import StateStore
from werk_host.store.records import PruneOutcome, StateRecord


class PromptCacheEntries:
    """The ``/werk/v1/prompt-caches`` operations over a host's prompt caches (module docstring)."""

    def __init__(self, caches: PromptCaches, fleet: Fleet) -> None:
        self.caches = caches
        self.fleet = fleet

    # -- reading -------------------------------------------------------------------------
    def _stores(self, only: str | None = None) -> Iterator[tuple[str, StateStore]]:
        for name in store_names(self.caches.home):
            if only is None or name == only:
                yield name, self.caches.store_named(name)

    def _current_keys(self) -> dict[str, dict[str, str] | None]:
        """Per instance store: the running backend's prompt-cache compatibility key, or
        ``None`` where no process of that instance runs (or it has no prompt cache)."""
        keys: dict[str, dict[str, str] | None] = {}
        deployments = self.fleet.deployments
        for label, instance in deployments.instances.items() if deployments is not None else ():
            adapter = instance.peek()
            cache = self.fleet.hooks.prompt_cache(adapter) if adapter is not None else None
            keys[self.caches.store_name(label)] = cache.cache_key() if cache is not None else None
        return keys

    @staticmethod
    def _entry(name: str, record: StateRecord, key: dict[str, str] | None) -> PromptCacheEntry:
        return PromptCacheEntry(
            id=f"{name}/{record.id}",
            instance=name,
            prompt_tokens=record.prompt_tokens,
            bytes=record.bytes,
            created_unix_ms=record.created_unix_ms,
            last_accessed_unix_ms=record.last_accessed_unix_ms,
            pinned=record.pinned,
            reusable=None if key is None else record.compat_key == key,
        )

    def _records(self, principal: Principal, only: str | None = None) -> Iterator[tuple[str, StateRecord]]:
        for name, store in self._stores(only):
            after = None
            while True:
                page, after = store.list_states(principal.id, after=after)
                yield from ((name, record) for record in page)
                if after is None:
                    break

    def list(self, principal: Principal, query: PromptCacheListQuery) -> PromptCacheList:
        """The caller's entries, most recently used first, at most ``query.limit``."""
        keys = self._current_keys()
        found = sorted(self._records(principal, query.instance), key=lambda e: -e[1].last_accessed_unix_ms)
        entries = [self._entry(name, record, keys.get(name)) for name, record in found[: query.limit]]
        return PromptCacheList(entries=entries, truncated=len(found) > query.limit)

    def _one(self, principal: Principal, entry_id: str) -> tuple[str, StateStore, StateRecord]:
        name, _, sid = entry_id.partition("/")
        for found, store in self._stores(name):
            record = store.get(principal.id, sid)
            if record is not None:
                return found, store, record
        raise WerkError(ErrorCode.NOT_FOUND, "no such prompt cache entry")

    # -- acting --------------------------------------------------------------------------
    def action(self, principal: Principal, entry_id: str, request: PromptCacheActionRequest) -> PromptCacheActionResult:
        """Pin, unpin or evict one of the caller's entries (or preview it)."""
        name, store, record = self._one(principal, entry_id)
        current = self._entry(name, record, self._current_keys().get(name))
        if request.action is PromptCacheActionKind.EVICT:
            projected = current.model_copy(update={"reusable": False})
            if request.dry_run:
                return PromptCacheActionResult(entry=projected, changed=True, dry_run=True)
            removed = store.delete(principal.id, record.id)
            return PromptCacheActionResult(entry=projected, changed=removed, dry_run=False)
        want = request.action is PromptCacheActionKind.PIN
        changed = record.pinned != want
        if request.dry_run:
            projected = current.model_copy(update={"pinned": want})
            return PromptCacheActionResult(entry=projected, changed=changed, dry_run=True)
        updated = store.set_pinned(principal.id, record.id, want)
        entry = self._entry(name, updated, self._current_keys().get(name))
        return PromptCacheActionResult(entry=entry, changed=changed, dry_run=False)

    def prune(self, principal: Principal, request: PromptCachePruneRequest) -> PruneResult:
        """Remove (or, by default, preview removing) the caller's entries the selector picks."""
        selector, dry_run = request.selector, request.dry_run
        outcomes: list[PruneOutcome] = []
        if isinstance(selector, PromptCacheIdsSelector):
            by_store: dict[str, list[str]] = {}
            for entry_id in selector.ids:
                name, _, sid = entry_id.partition("/")
                by_store.setdefault(name, []).append(sid)
            for name, store in self._stores():
                if name in by_store:
                    outcomes.append(store.prune(principal.id, ids=by_store[name], dry_run=dry_run))
        else:
            only = selector.instance if isinstance(selector, PromptCacheFilterSelector) else None
            older = selector.older_than_unix_ms if isinstance(selector, PromptCacheFilterSelector) else None
            for _, store in self._stores(only):
                if older is not None:
                    outcomes.append(store.prune(principal.id, older_than_unix_ms=older, dry_run=dry_run))
                else:
                    outcomes.append(store.prune(principal.id, everything=True, dry_run=dry_run))
        matched, removed = sum(o.matched for o in outcomes), sum(o.removed for o in outcomes)
        size = sum(o.bytes or 0 for o in outcomes)
        return PruneResult(matched=matched, removed=removed, bytes=size, dry_run=dry_run)


class PromptCacheOperations:
    """The :class:`~werk_host.control.WerkControl` operations over the host's
    :class:`PromptCacheEntries` (the local control service inherits them)."""

    prompt_cache_entries: PromptCacheEntries

    def list_prompt_caches(self, principal: Principal, query: PromptCacheListQuery) -> PromptCacheList:
        return self.prompt_cache_entries.list(principal, query)

    def prompt_cache_action(
        self, principal: Principal, entry_id: str, request: PromptCacheActionRequest
    ) -> PromptCacheActionResult:
        return self.prompt_cache_entries.action(principal, entry_id, request)

    def prune_prompt_caches(self, principal: Principal, request: PromptCachePruneRequest) -> PruneResult:
        return self.prompt_cache_entries.prune(principal, request)

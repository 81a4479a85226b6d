"""Named states: the listing, state actions and prune (``/werk/v1/states``), per principal.

A page of a listing is built from one store page (:meth:`werk_host.store.StateStore.list_page`)
and the compatibility keys of its models on the request's instance, and kept in the service's
one cache layer (:mod:`werk_host.service.cache`) under their stamps: the store page's read
stamp, and the compatibility keys themselves. The compatibility keys are evidence about the adapter and are
asked again only when the evidence stamp moves (another adapter process, any operation hook
since, or the next :data:`~werk_host.service.capabilities.EVIDENCE_TTL_S` window;
:meth:`~werk_host.service.capabilities.CapabilityResolver.evidence_key`). So a listing changes
exactly when a stamp does (a commit, delete, pin or expiry the store sees; a backend restart or
operation), and is the same :class:`~werk_host.service.cache.Shared` result otherwise.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from werk_host.errors import ErrorCode, WerkError
from werk_host.hooks import BackendHooks, needed
from werk_host.memory import MemoryManager
from werk_host.protocol import (
    CapabilityId,
    PruneRequest,
    PruneResult,
    StateActionKind,
    StateActionRequest,
    StateActionResult,
    StateListQuery,
    StatePage,
    StateStatus,
    StateSummary,
    Tier,
    tier_moves_in_direction,
)
from werk_host.protocol.states import AllSelector, FilterSelector, IdsSelector
from werk_host.seam import Adapter, CapabilityReport, MoveWork, StoredStateRef
from werk_host.service.cache import Shared, StampedCache
from werk_host.service.capabilities import CapabilityResolver
from werk_host.service.cursors import CursorCodec
from werk_host.service.leases import MemoryLeases
from werk_host.service.principals import Principal
from werk_host.service.scope import RequestScope
from werk_host.store import StateRecord, StateStore

#: Bound on the kept pages and compatibility keys (each map cleared wholesale when reached).
_MAX_PAGES = 256
_MAX_COMPAT_KEYS = 256
#: One compatibility key in hashable form (its sorted items; ``None``: none, or no adapter),
#: in a 1-tuple so that a kept ``None`` is told from a miss.
CompatKey = tuple[tuple[tuple[str, str], ...] | None]
#: (model id, its compatibility key on the request's adapter) per model of a page
CompatKeys = tuple[tuple[str, CompatKey], ...]
Gate = Callable[[RequestScope, "Adapter | None", CapabilityId, bool], CapabilityReport]


def _now_ms() -> int:
    return int(time.time() * 1000)


def summary(record: StateRecord, compat_key: dict[str, str] | None, now_ms: int) -> StateSummary:
    """``record`` as the protocol lists it; ``reusable`` when ``compat_key`` (the compatibility key
    of its model on the instance now) equals the one it was stored under."""
    expired = record.is_expired(now_ms)
    return StateSummary(
        id=record.id,
        model_id=record.model_id,
        backend=record.backend,
        tier=Tier(record.tier),
        status=StateStatus.UNAVAILABLE if expired else StateStatus.READY,
        bytes=record.bytes,
        created_unix_ms=record.created_unix_ms,
        last_accessed_unix_ms=record.last_accessed_unix_ms,
        expires_unix_ms=record.expires_unix_ms,
        pinned=record.pinned,
        reusable=(not expired) and compat_key is not None and compat_key == record.compat_key,
    )


class StateCatalog:
    """The ``/werk/v1/states`` operations (see the module docstring)."""

    def __init__(
        self,
        *,
        store: StateStore,
        hooks: BackendHooks,
        resolver: CapabilityResolver,
        cursors: CursorCodec,
        memory: MemoryManager,
        leases: MemoryLeases,
        gate: Gate,
    ) -> None:
        self.store = store
        self.hooks = hooks
        self.resolver = resolver
        self.cursors = cursors
        self.memory_manager = memory
        self.leases = leases
        self._gate = gate
        #: (listing scope, limit, after) -> the page, under (store page stamp, compat_keys)
        self._pages: StampedCache[tuple[str, int, str | None], Shared[StatePage]] = StampedCache(_MAX_PAGES)
        #: (listing scope, limit, after) -> the models on the page, under the store page stamp
        self._models: StampedCache[tuple[str, int, str | None], tuple[str, ...]] = StampedCache(_MAX_PAGES)
        #: (adapter identity, instance id, model) -> its compatibility key, under the evidence key
        self._compat_keys: StampedCache[tuple[str, str | None, str], CompatKey] = StampedCache(_MAX_COMPAT_KEYS)

    def compat_key(self, adapter: Adapter, model_id: str) -> dict[str, str] | None:
        """``model_id``'s compatibility key on ``adapter`` now (``None``: it has none)."""
        try:
            return self.hooks.compat_key(adapter, model_id)
        except WerkError:
            return None

    def _kept_compat_keys(self, scope: RequestScope, models: tuple[str, ...]) -> CompatKeys:
        """The compatibility key of each of ``models`` on the request's adapter, asked again only when
        the evidence key moved (module docstring)."""
        adapter = scope.adapter
        if adapter is None:
            return tuple((model, (None,)) for model in models)
        stamp = self.resolver.evidence_key(adapter)
        found: list[tuple[str, CompatKey]] = []
        instance = scope.instance.id if scope.instance is not None else None
        for model in models:
            key = (stamp[0], instance, model)
            held = self._compat_keys.get(key, stamp)
            if held is None:
                compat_key = self.compat_key(adapter, model)
                held = self._compat_keys.put(
                    key, stamp, (tuple(sorted(compat_key.items())) if compat_key is not None else None,)
                )
            found.append((model, held))
        return tuple(found)

    # -- the listing -----------------------------------------------------------------------
    def list_states(self, scope: RequestScope, query: StateListQuery) -> Shared[StatePage]:
        principal = scope.principal
        where = f"states:{principal.id}:{query.model_id}:{query.tier}"
        after = self.cursors.decode(query.cursor, where) if query.cursor else None
        listed = self.store.list_page(
            principal.id,
            model_id=query.model_id,
            tier=query.tier.value if query.tier else None,
            limit=query.limit,
            after=after,
        )
        key = (where, query.limit, after)
        models = self._models.get(key, listed.stamp)  # the page's models, once per store read
        if models is None:
            models = self._models.put(key, listed.stamp, tuple(sorted({r.model_id for r in listed.records})))
        compat_keys = self._kept_compat_keys(scope, models)
        stamp = (listed.stamp, compat_keys)
        kept = self._pages.get(key, stamp)
        if kept is not None:
            return kept
        by_model = {model: dict(held[0]) if held[0] is not None else None for model, held in compat_keys}
        now = _now_ms()
        states = [summary(record, by_model[record.model_id], now) for record in listed.records]
        cursor = self.cursors.encode(listed.after, where) if listed.after else None
        return self._pages.put(key, stamp, Shared(StatePage(states=states, next_cursor=cursor)))

    # -- actions -----------------------------------------------------------------------------
    def state_action(self, scope: RequestScope, state_id: str, request: StateActionRequest) -> StateActionResult:
        principal = scope.principal
        record = self.record_or_404(principal, state_id)
        adapter = scope.adapter
        compat_key = self.compat_key(adapter, record.model_id) if adapter else None
        now = _now_ms()
        current = summary(record, compat_key, now)
        action = request.action
        if action in (StateActionKind.PIN, StateActionKind.UNPIN):
            want = action is StateActionKind.PIN
            if request.dry_run:
                return StateActionResult(
                    state=current.model_copy(update={"pinned": want}), changed=record.pinned != want, dry_run=True
                )
            self.memory_manager.check_mutation_allowed()
            updated = self.store.set_pinned(principal.id, state_id, want)
            return StateActionResult(
                state=summary(updated, compat_key, now), changed=record.pinned != want, dry_run=False
            )
        if action is StateActionKind.EVICT:
            projected = current.model_copy(update={"status": StateStatus.UNAVAILABLE, "reusable": False})
            if request.dry_run:
                return StateActionResult(state=projected, changed=True, dry_run=True)
            self.memory_manager.check_mutation_allowed()
            removed = self.store.delete(principal.id, state_id)
            self.leases.release(state_id)
            return StateActionResult(state=projected, changed=removed, dry_run=False)
        # promote / demote: direction first, then the target tier's capability, then the adapter.
        target = request.target_tier
        assert target is not None  # the DTO guarantees it for promote/demote
        if not tier_moves_in_direction(current.tier, target, action):
            raise WerkError(
                ErrorCode.INVALID_REQUEST, f"{action.value} cannot move a {current.tier.value} state to {target.value}"
            )
        self._gate(scope, scope.started(), CapabilityId.tier(target.value), request.allow_experimental)
        adapter = scope.require_adapter("state movement")
        if not request.dry_run:
            self.memory_manager.check_mutation_allowed()
        work = MoveWork(self.stored_ref(principal, record), action.value, target, request.dry_run)
        moved = needed(self.hooks.state_move(adapter, work), "state movement", adapter)
        projected = current.model_copy(update={"tier": moved.tier})
        if not request.dry_run and moved.delete_stored:
            self.store.delete(principal.id, state_id)
        return StateActionResult(state=projected, changed=moved.changed, dry_run=request.dry_run)

    def prune_states(self, principal: Principal, request: PruneRequest) -> PruneResult:
        selector = request.selector
        kwargs: dict[str, Any] = {}
        if isinstance(selector, IdsSelector):
            kwargs["ids"] = list(selector.ids)
        elif isinstance(selector, FilterSelector):
            kwargs.update(
                model_id=selector.model_id,
                tier=selector.tier.value if selector.tier else None,
                older_than_unix_ms=selector.older_than_unix_ms,
            )
        elif isinstance(selector, AllSelector):
            kwargs["everything"] = True
        if not request.dry_run:
            self.memory_manager.check_mutation_allowed()
        outcome = self.store.prune(principal.id, dry_run=request.dry_run, **kwargs)
        if not request.dry_run:
            self._release_orphaned_leases(principal)
        return PruneResult(
            matched=outcome.matched, removed=outcome.removed, bytes=outcome.bytes, dry_run=request.dry_run
        )

    def _release_orphaned_leases(self, principal: Principal) -> None:
        for key in self.leases.keys_for(principal.id):
            if self.store.get(principal.id, key) is None:
                self.leases.release(key)

    def record_or_404(self, principal: Principal, state_id: str) -> StateRecord:
        record = self.store.get(principal.id, state_id)
        if record is None:
            raise WerkError(ErrorCode.NOT_FOUND, "no such state")
        return record

    def stored_ref(self, principal: Principal, record: StateRecord) -> StoredStateRef:
        store, pid, sid = self.store, principal.id, record.id
        return StoredStateRef(
            state_id=record.id,
            compat_key=dict(record.compat_key),
            prompt_tokens=record.prompt_tokens,
            bytes=record.bytes,
            adapter_meta=dict(record.adapter_meta),
            open_payload=lambda: store.open_payload(pid, sid),
        )

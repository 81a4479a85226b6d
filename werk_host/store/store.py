"""The runtime-state catalog: :class:`StateStore`, its commit path, reads and per-principal mutations.

The store is layered, one concern per module (each module states its own contract):

* :mod:`.layout`: the on-disk layout, bounds and shared value types;
* :mod:`.base`: construction, the no-follow root walk and the two locks;
* :mod:`.index`: lock-free listing, metadata and fingerprint caches;
* :mod:`.reconcile`: inspection, removal and quarantine under the locks;
* :mod:`.verify`: verified payload reads and integrity checks;
* :mod:`.admin`: inventory and purge across principals (``werk cache``);
* :mod:`.quota`: the storage bounds (states and bytes, store-wide and per principal);
* :mod:`.commit`: the commit path (staging, streaming, bounds, atomic publication);
* this module: ``get``/``list_states``/``find_by_fingerprint``, pinning, deletion and
  pruning.

Contracts:

* Constructing a store creates nothing. Only :meth:`StateStore.commit` creates the tree.
* Reads (:meth:`~StateStore.get`, :meth:`~StateStore.list_states`,
  :meth:`~StateStore.find_by_fingerprint`, :meth:`~StateStore.inventory`, the dry runs of
  :meth:`~StateStore.prune` and :meth:`~StateStore.purge`) take no file lock and create,
  repair, touch, quarantine or delete nothing; invalid or expired entries are omitted.
  :meth:`~StateStore.verify` is read-only while the payload is intact; a payload that
  fails verification is quarantined at once, by a reconciliation under the locks.
* Every real mutation holds the process mutex and the ``.lock`` advisory lock and
  reconciles first. A commit streams its payload *outside* the catalog lock into a
  ``.staging-*`` directory on which it holds an exclusive ``flock`` (its liveness lock):
  a staging entry whose lock can be taken belongs to a dead or failed commit and is
  removed; a live one is left alone, in this process or any other.
* Paths are walked with descriptor-relative no-follow calls; a planted link is never
  followed, only unlinked (inside the catalog) or refused (the root itself).
"""

from __future__ import annotations

import bisect
import dataclasses
import os
import time
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any

from werk_host.errors import invalid, not_found

from . import _fs
from .admin import AdminStore
from .commit import CommittingStore
from .layout import PINNED, Kind, Look, os_error
from .records import (
    DISK_TIER,
    KNOWN_TIERS,
    PruneOutcome,
    StateRecord,
    is_state_id,
    validate_principal,
)
from .watch import PAGE_STAMPS, Page, Watcher

MAX_PAGE = 100
MAX_IDS_PER_OPERATION = 100
#: Bound on the listed pages kept for reuse (cleared wholesale when reached).
_MAX_PAGES = 256


@dataclasses.dataclass(frozen=True)
class ListedPage:
    """One page of :meth:`StateStore.list_page`: its records (read-only, shared), the id to
    pass as ``after`` for the next page (``None``: no further state) and the page's stamp."""

    records: list[StateRecord]
    after: str | None
    stamp: int


class StateStore(CommittingStore, AdminStore):
    """Durable, principal-scoped catalog of opaque runtime-state payloads.

    ``root`` is ``WERK_HOME/runtime-state/v1``. ``WERK_HOME`` itself may be a link the user
    chose; ``runtime-state`` and ``v1`` must be real directories (a link there makes reads
    empty and mutations fail with ``forbidden``). ``clock`` returns unix seconds and drives
    creation, access and expiry times. ``durable=False`` skips fsync (benchmarks only).
    ``audit_batch`` bounds how many already-validated states one reconciliation re-inspects
    (new, suspect and expired states are always handled). ``max_states`` and ``max_bytes``
    bound what the whole store holds, ``max_states_per_key`` and ``max_bytes_per_key`` what
    one principal holds (``None``: a quarter of the store-wide bound; :mod:`.quota`).
    """

    # ------------------------------------------------------------------ reads

    def get(self, principal: str, state_id: str) -> StateRecord | None:
        """Read-only lookup; ``None`` for absent, expired, invalid or foreign ids."""
        validate_principal(principal)
        if not is_state_id(state_id):
            return None
        pfd = self._open_principal_ro(principal)
        if pfd is None:
            return None
        try:
            look = self._look(pfd, principal, state_id, self._now_ms())
            return look.record if look.kind == Kind.OK else None
        except OSError:
            return None
        finally:
            os.close(pfd)

    def list_states(
        self,
        principal: str,
        *,
        model_id: str | None = None,
        tier: str | None = None,
        limit: int = MAX_PAGE,
        after: str | None = None,
    ) -> tuple[list[StateRecord], str | None]:
        """:meth:`list_page`'s records and the id to pass as ``after`` for the next page."""
        page = self.list_page(principal, model_id=model_id, tier=tier, limit=limit, after=after)
        return page.records, page.after

    def list_page(
        self,
        principal: str,
        *,
        model_id: str | None = None,
        tier: str | None = None,
        limit: int = MAX_PAGE,
        after: str | None = None,
    ) -> ListedPage:
        """One read-only page ordered by id, strictly after ``after``, with its stamp.

        Returns the page and the id to pass as ``after`` for the next page (``None`` when
        no further visible state exists). Cost is proportional to the entries examined,
        not to the catalog: ids come from a cached per-principal index. Where the directories
        read are watched (:mod:`.watch`), the same page (the same list object: read-only) is
        returned again while nothing under them changed, no suspect mark changed and no state
        on it expired, for at most :data:`.watch.PAGE_MAX_AGE_S`, without touching the disk.
        ``stamp`` is equal for two answers only when the second is that same reused page
        (:data:`.watch.PAGE_STAMPS`): what callers build from a page they key by it.
        """
        validate_principal(principal)
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_PAGE:
            raise invalid("limit must be between 1 and 100")
        if after is not None and not is_state_id(after):
            raise invalid("invalid cursor")
        if tier is not None and tier not in KNOWN_TIERS:
            raise invalid("unknown tier")
        if model_id is not None and not isinstance(model_id, str):
            raise invalid("model_id must be a string")
        if tier is not None and tier != DISK_TIER:
            return ListedPage([], None, next(PAGE_STAMPS))
        now_ms = self._now_ms()
        watcher = Watcher.shared()
        page_key = (principal, model_id, tier, limit, after)
        epoch = watcher.epoch() if watcher is not None else None
        suspects = self._suspects_changed
        if epoch is not None:
            page = self._pages.get(page_key)  # a dict read is atomic; writers hold the lock
            if page is not None and page.reusable(epoch, suspects, now_ms, time.monotonic()):
                return ListedPage(page.records, page.after, page.stamp)
        born = time.monotonic()
        pfd = self._open_principal_ro(principal)
        if pfd is None:
            return ListedPage([], None, next(PAGE_STAMPS))
        out: list[StateRecord] = []
        # watched before read (watch.py): reusable only if every directory read is watched
        reusable = epoch is not None and watcher is not None and watcher.watch((self._root, principal), pfd)
        until_ms: int | None = None
        try:
            listing = self._listing(principal, pfd)
            ids = listing.ids
            ok = Kind.OK
            i = bisect.bisect_right(ids, after) if after is not None else 0
            next_after = None
            while i < len(ids):
                if reusable and watcher is not None:
                    reusable = self._watch_state(watcher, pfd, principal, ids[i])
                look = self._look(pfd, principal, ids[i], now_ms)
                i += 1
                rec = look.record
                if look.kind is not ok or rec is None:
                    continue
                if model_id is not None and rec.model_id != model_id:
                    continue
                if rec.expires_unix_ms is not None and (until_ms is None or rec.expires_unix_ms < until_ms):
                    until_ms = rec.expires_unix_ms
                if len(out) == limit:
                    next_after = out[-1].id
                    break
                out.append(rec)
        except OSError:
            return ListedPage(out, None, next(PAGE_STAMPS))
        finally:
            os.close(pfd)
        stamp = next(PAGE_STAMPS)
        if reusable and epoch is not None:
            with self._cache_lock:
                if len(self._pages) >= _MAX_PAGES:
                    self._pages.clear()
                self._pages[page_key] = Page(epoch, suspects, until_ms, born, out, next_after, stamp)
        return ListedPage(out, next_after, stamp)

    def _watch_state(self, watcher: Watcher, pfd: int, principal: str, sid: str) -> bool:
        """Watch state directory ``sid`` (before it is read); whether it is watched."""
        try:
            sfd = _fs.open_dir(sid, pfd)
        except OSError:
            return False
        try:
            return watcher.watch((self._root, principal, sid), sfd)
        finally:
            os.close(sfd)

    def find_by_fingerprint(self, principal: str, prompt_fingerprint: str) -> list[StateRecord]:
        """Read-only: this principal's valid, non-expired states with that fingerprint (by id)."""
        validate_principal(principal)
        if not isinstance(prompt_fingerprint, str) or not prompt_fingerprint:
            return []
        pfd = self._open_principal_ro(principal)
        if pfd is None:
            return []
        try:
            now_ms = self._now_ms()
            out: list[StateRecord] = []
            for sid in self._ids_with_fingerprint(principal, pfd, prompt_fingerprint):
                look = self._look(pfd, principal, sid, now_ms)
                if (
                    look.kind == Kind.OK
                    and look.record is not None
                    and look.record.prompt_fingerprint == prompt_fingerprint
                ):
                    out.append(look.record)
            return out
        except OSError:
            return []
        finally:
            os.close(pfd)

    # ------------------------------------------------------------------ mutations

    def _target(self, rootfd: int, principal: str, state_id: str) -> tuple[int, Look] | None:
        """Inspect a mutation target after reconciliation; returns (principal fd, look) if live."""
        if not is_state_id(state_id):
            return None
        pfd = self._principal_fd(rootfd, principal, create=False)
        if pfd is None:
            return None
        try:
            look = self._inspect(pfd, principal, state_id, self._now_ms(), deep=False)
            if self._settle(rootfd, pfd, principal, state_id, look):
                return pfd, look
            self._rescan(principal, pfd, exact=True)
        except BaseException:
            os.close(pfd)
            raise
        os.close(pfd)
        return None

    def set_pinned(self, principal: str, state_id: str, pinned: bool) -> StateRecord:
        """Create or remove the ``pinned`` marker; ``not_found`` for absent/expired/foreign ids."""
        validate_principal(principal)
        try:
            with self._mutating(create=False) as rootfd:
                if rootfd is None:
                    raise not_found()
                self._reconcile_locked(rootfd)
                found = self._target(rootfd, principal, state_id)
                if found is None:
                    raise not_found()
                pfd, look = found
                try:
                    assert look.record is not None
                    sfd = _fs.open_dir(state_id, pfd)
                    try:
                        if pinned and not look.pinned:
                            _fs.write_new_file(PINNED, sfd, b"", durable=self._durable)
                            self._fsync(sfd)
                        elif not pinned and look.pinned:
                            os.unlink(PINNED, dir_fd=sfd)
                            self._fsync(sfd)
                    finally:
                        os.close(sfd)
                    return dataclasses.replace(look.record, pinned=bool(pinned))
                finally:
                    os.close(pfd)
        except OSError as exc:
            raise os_error(exc) from exc

    def delete(self, principal: str, state_id: str) -> bool:
        """Delete one state (pinned or not); False when absent, expired, invalid or foreign."""
        validate_principal(principal)
        try:
            with self._mutating(create=False) as rootfd:
                if rootfd is None:
                    return False
                self._reconcile_locked(rootfd)
                found = self._target(rootfd, principal, state_id)
                if found is None:
                    return False
                pfd, _look = found
                try:
                    self._remove_states(pfd, [state_id])
                    self._forget(principal, state_id)
                    self._rescan(principal, pfd, exact=True)
                finally:
                    os.close(pfd)
                return True
        except OSError as exc:
            raise os_error(exc) from exc

    def _match(
        self,
        records: Iterable[StateRecord],
        *,
        model_id: str | None,
        tier: str | None,
        older_than_unix_ms: int | None,
        skip_pinned: bool,
        exclude: Collection[str],
    ) -> list[StateRecord]:
        out = []
        for rec in records:
            if model_id is not None and rec.model_id != model_id:
                continue
            if tier is not None and rec.tier != tier:
                continue
            if older_than_unix_ms is not None and rec.created_unix_ms >= older_than_unix_ms:
                continue
            if (skip_pinned and rec.pinned) or rec.id in exclude:
                continue
            out.append(rec)
        return out

    def _visible(self, pfd: int, principal: str, ids: Iterable[str], *, locked: bool) -> list[StateRecord]:
        now_ms = self._now_ms()
        out = []
        for sid in ids:
            if locked:
                look = self._inspect(pfd, principal, sid, now_ms, deep=False)
            else:
                look = self._look(pfd, principal, sid, now_ms)
            if look.kind == Kind.OK and look.record is not None:
                out.append(look.record)
        return out

    def prune(
        self,
        principal: str,
        *,
        ids: list[str] | None = None,
        model_id: str | None = None,
        tier: str | None = None,
        older_than_unix_ms: int | None = None,
        everything: bool = False,
        dry_run: bool = True,
        skip_pinned: bool = False,
        exclude: Collection[str] = frozenset(),
    ) -> PruneOutcome:
        """Remove this principal's visible states chosen by exactly one selector.

        Selectors: ``ids`` (1..100 unique), a filter with at least one non-null restriction
        (``model_id``, ``tier``, ``older_than_unix_ms`` compared with creation time), or
        ``everything=True`` (the caller checks the confirmation). ``dry_run`` (default) is
        read-only and reports ``removed == 0``. ``bytes`` is the logical size of the
        matched states (preview) or of the removed ones.
        """
        validate_principal(principal)
        has_filter = model_id is not None or tier is not None or older_than_unix_ms is not None
        if sum((ids is not None, has_filter, bool(everything))) != 1:
            raise invalid("prune requires exactly one selector")
        if ids is not None and (
            not isinstance(ids, list)
            or not 1 <= len(ids) <= MAX_IDS_PER_OPERATION
            or len(set(ids)) != len(ids)
            or not all(isinstance(i, str) for i in ids)
        ):
            raise invalid("ids must be 1 through 100 unique state ids")
        if tier is not None and tier not in KNOWN_TIERS:
            raise invalid("unknown tier")
        if older_than_unix_ms is not None and (
            not isinstance(older_than_unix_ms, int) or isinstance(older_than_unix_ms, bool)
        ):
            raise invalid("older_than_unix_ms must be an integer")
        wanted: list[str] | None = None if ids is None else sorted(i for i in ids if is_state_id(i))
        crit: dict[str, Any] = {
            "model_id": model_id,
            "tier": tier,
            "older_than_unix_ms": older_than_unix_ms,
            "skip_pinned": skip_pinned,
            "exclude": frozenset(exclude),
        }
        if dry_run:
            pfd = self._open_principal_ro(principal)
            if pfd is None:
                return PruneOutcome(0, 0, 0, True)
            try:
                candidates = wanted if wanted is not None else self._listing(principal, pfd).ids
                matched = self._match(self._visible(pfd, principal, candidates, locked=False), **crit)
            except OSError:
                matched = []
            finally:
                os.close(pfd)
            return PruneOutcome(len(matched), 0, sum(r.bytes or 0 for r in matched), True)
        try:
            with self._mutating(create=False) as rootfd:
                if rootfd is None:
                    return PruneOutcome(0, 0, 0, False)
                self._reconcile_locked(rootfd)
                pfd = self._principal_fd(rootfd, principal, create=False)
                if pfd is None:
                    return PruneOutcome(0, 0, 0, False)
                try:
                    candidates = wanted if wanted is not None else self._listing(principal, pfd, exact=True).ids
                    matched = self._match(self._visible(pfd, principal, candidates, locked=True), **crit)
                    self._remove_states(pfd, [r.id for r in matched])
                    for r in matched:
                        self._forget(principal, r.id)
                    if matched:
                        self._rescan(principal, pfd, exact=True)
                finally:
                    os.close(pfd)
                n = len(matched)
                return PruneOutcome(n, n, sum(r.bytes or 0 for r in matched), False)
        except OSError as exc:
            raise os_error(exc) from exc


def runtime_state_root(werk_home: Path) -> Path:
    """``WERK_HOME/runtime-state/v1`` (nothing is created)."""
    return Path(werk_home) / "runtime-state" / "v1"

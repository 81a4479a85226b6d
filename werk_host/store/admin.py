"""Administration across principals, for ``werk cache list`` and ``werk cache purge``.

Contract:

* :meth:`AdminStore.inventory` and a dry-run :meth:`AdminStore.purge` are read-only: no
  lock is taken and nothing is created, repaired or removed. Quarantine entries are
  reported with the principal prefix from their name; principals only by their first
  8 hex characters.
* ``active`` means a process holds the payload open for use, or, for a staging entry,
  that a live commit holds its liveness lock. A purge never removes pinned or active
  states, nor staging entries (reconciliation owns those).
* A real purge takes the same locks as the server, reconciles fully first and reports
  against what the caller saw before it: an entry that reconciliation itself removed or
  quarantined counts as purged.
"""

from __future__ import annotations

import fcntl
import os
import stat
from collections.abc import Collection

from werk_host.errors import invalid

from . import _fs
from .layout import PAYLOAD, QUARANTINE, STAGING_PREFIX, Kind, Look, os_error
from .reconcile import ReconcilingStore
from .records import PRINCIPAL_RE, STATE_ID_RE, InventoryEntry, PurgeOutcome

#: An inventory entry with its full principal (``None`` for quarantine entries).
_Pair = tuple[InventoryEntry, str | None]


def _staging_live(pfd: int, name: str) -> bool:
    """Whether a commit (in any process) holds the staging entry's liveness lock."""
    try:
        fd = _fs.open_dir(name, pfd)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing releases a lock we just took
    return False


def _payload_in_use(sfd: int) -> bool:
    """Whether a process holds the payload open for use (a shared ``flock``, see ``open_payload``)."""
    try:
        fd = os.open(PAYLOAD, _fs.READ_FLAGS, dir_fd=sfd)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def _plain_entry(kind: str, name: str, principal: str, dir_fd: int, *, active: bool) -> InventoryEntry:
    return InventoryEntry(
        kind=kind,
        id=name,
        principal_prefix=principal[:8],
        model_id=None,
        backend=None,
        bytes=None,
        disk_bytes=_fs.tree_size(name, dir_fd),
        pinned=False,
        active=active,
        expired=False,
        invalid=False,
        created_unix_ms=None,
        last_accessed_unix_ms=None,
        expires_unix_ms=None,
    )


def _original(e: InventoryEntry) -> str:
    """A quarantine entry's original state directory name; other entries' own id."""
    return e.id.split("-", 3)[-1] if e.kind == "quarantine" else e.id


class AdminStore(ReconcilingStore):
    """Inventory and purge across every principal of the root."""

    def _inventory_fd(self, rootfd: int) -> list[tuple[InventoryEntry, str | None]]:
        """Entries paired with their full principal (None for quarantine entries)."""
        now_ms = self._now_ms()
        out: list[tuple[InventoryEntry, str | None]] = []
        for name in sorted(os.listdir(rootfd)):
            st = _fs.lstat_at(name, rootfd)
            if st is None or not stat.S_ISDIR(st.st_mode):
                continue
            if name == QUARANTINE:
                try:
                    qfd = _fs.open_dir(QUARANTINE, rootfd)
                except OSError:
                    continue
                try:
                    for qname in sorted(os.listdir(qfd)):
                        parts = qname.split("-", 3)
                        out.append(
                            (
                                InventoryEntry(
                                    kind="quarantine",
                                    id=qname,
                                    principal_prefix=parts[2] if len(parts) == 4 else None,
                                    model_id=None,
                                    backend=None,
                                    bytes=None,
                                    disk_bytes=_fs.tree_size(qname, qfd),
                                    pinned=False,
                                    active=False,
                                    expired=False,
                                    invalid=True,
                                    created_unix_ms=None,
                                    last_accessed_unix_ms=None,
                                    expires_unix_ms=None,
                                ),
                                None,
                            )
                        )
                finally:
                    os.close(qfd)
                continue
            if not (name.startswith("p_") and PRINCIPAL_RE.fullmatch(name[2:])):
                continue
            principal = name[2:]
            try:
                pfd = _fs.open_dir(name, rootfd)
            except OSError:
                continue
            try:
                for entry in sorted(os.listdir(pfd)):
                    if entry.startswith(STAGING_PREFIX):
                        live = _staging_live(pfd, entry)
                        out.append((_plain_entry("staging", entry, principal, pfd, active=live), principal))
                        continue
                    if not STATE_ID_RE.fullmatch(entry):
                        continue
                    try:
                        sfd = _fs.open_dir(entry, pfd)
                    except OSError:
                        continue
                    try:
                        look = self._look_in(sfd, principal, entry, now_ms)
                        active = _payload_in_use(sfd)
                    except OSError:
                        look, active = Look(Kind.INVALID), False
                    finally:
                        os.close(sfd)
                    meta, rec = look.meta, look.record
                    out.append(
                        (
                            InventoryEntry(
                                kind="state",
                                id=entry,
                                principal_prefix=principal[:8],
                                model_id=meta.model_id if meta else None,
                                backend=meta.backend if meta else None,
                                bytes=meta.size if meta else None,
                                disk_bytes=_fs.tree_size(entry, pfd),
                                pinned=look.pinned,
                                active=active,
                                expired=look.kind == Kind.EXPIRED,
                                invalid=look.kind not in (Kind.OK, Kind.EXPIRED),
                                created_unix_ms=meta.created_unix_ms if meta else None,
                                last_accessed_unix_ms=rec.last_accessed_unix_ms if rec else None,
                                expires_unix_ms=meta.expires_unix_ms if meta else None,
                            ),
                            principal,
                        )
                    )
            finally:
                os.close(pfd)
        return out

    def inventory(self) -> list[InventoryEntry]:
        """Read-only inventory of every principal's states, quarantine and staging entries.

        ``active`` means a process holds the payload open for use (a shared ``flock`` taken
        by :meth:`open_payload`), or, for a staging entry, that a
        live commit holds its liveness lock.
        """
        rootfd = self._open_root(create=False, strict=False)
        if rootfd is None:
            return []
        try:
            return [e for e, _p in self._inventory_fd(rootfd)]
        except OSError:
            return []
        finally:
            os.close(rootfd)

    def purge(
        self,
        ids: list[str] | None = None,
        everything: bool = False,
        dry_run: bool = False,
        active: Collection[str] = frozenset(),
    ) -> PurgeOutcome:
        """Administrative cleanup across principals (``werk cache purge``).

        Exactly one of ``ids`` (state ids or quarantine entry names) or ``everything``. Pinned
        states and active ones (in ``active`` or with a payload in use) are skipped.
        ``everything`` also clears the quarantine. A real run takes the same locks as the server
        and reconciles fully first; ``dry_run`` is read-only.
        """
        if (ids is not None and len(ids) > 0) == bool(everything):
            raise invalid("purge requires either ids or all")
        wanted = frozenset(ids or ())
        keep_active = frozenset(active)

        def plan(entries: list[_Pair]) -> tuple[list[_Pair], list[InventoryEntry], int, int]:
            chosen: list[_Pair] = []
            skipped: list[InventoryEntry] = []
            n_pinned = n_active = 0
            for e, principal in entries:
                if e.kind == "staging":
                    continue
                if not everything and e.id not in wanted and _original(e) not in wanted:
                    continue
                if e.kind == "state" and e.pinned and not e.expired and not e.invalid:
                    skipped.append(e)
                    n_pinned += 1
                    continue
                if e.active or e.id in keep_active:
                    skipped.append(e)
                    n_active += 1
                    continue
                chosen.append((e, principal))
            return chosen, skipped, n_pinned, n_active

        if dry_run:
            rootfd = self._open_root(create=False, strict=False)
            entries: list[_Pair] = []
            if rootfd is not None:
                try:
                    entries = self._inventory_fd(rootfd)
                except OSError:
                    entries = []
                finally:
                    os.close(rootfd)
            chosen, skipped, n_pinned, n_active = plan(entries)
            return PurgeOutcome(
                matched=len(chosen) + len(skipped),
                removed=0,
                skipped_pinned=n_pinned,
                skipped_active=n_active,
                bytes=sum(e.disk_bytes or 0 for e, _p in chosen),
                dry_run=True,
                ids=[e.id for e, _p in chosen],
                skipped_ids=[e.id for e in skipped],
            )
        try:
            with self._mutating(create=False) as rootfd:
                if rootfd is None:
                    return PurgeOutcome(0, 0, 0, 0, 0, False, [], [])
                # Report against what the caller saw (the pre-reconcile view): an expired or
                # corrupt entry that reconciliation removes or quarantines counts as purged.
                pre_chosen, pre_skipped, n_pinned, n_active = plan(self._inventory_fd(rootfd))
                self._reconcile_locked(rootfd, full=True)
                post = self._inventory_fd(rootfd)
                chosen, _skipped, _np, _na = plan(post)
                gone: set[str] = set()
                extra: list[InventoryEntry] = []
                pre_names = {_original(e) for e, _p in pre_chosen}
                for e, principal in chosen:
                    if e.kind == "quarantine":
                        qfd = _fs.open_dir(QUARANTINE, rootfd)
                        try:
                            _fs.remove_entry(e.id, qfd)
                            self._fsync(qfd)
                        finally:
                            os.close(qfd)
                    elif principal is not None:
                        pfd = _fs.open_dir("p_" + principal, rootfd)
                        try:
                            self._remove_states(pfd, [e.id])
                            self._forget(principal, e.id)
                            self._rescan(principal, pfd, exact=True)
                        finally:
                            os.close(pfd)
                    else:
                        continue
                    gone.add(_original(e))
                    if _original(e) not in pre_names:
                        extra.append(e)
                remaining = {_original(e) for e, _p in post} - gone
                removed = [e for e, _p in pre_chosen if _original(e) not in remaining] + extra
                return PurgeOutcome(
                    matched=len(pre_chosen) + len(pre_skipped) + len(extra),
                    removed=len(removed),
                    skipped_pinned=n_pinned,
                    skipped_active=n_active,
                    bytes=sum(e.disk_bytes or 0 for e in removed),
                    dry_run=False,
                    ids=[e.id for e in removed],
                    skipped_ids=[e.id for e in pre_skipped],
                )
        except OSError as exc:
            raise os_error(exc) from exc

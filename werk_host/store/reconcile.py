"""Reconciliation under the locks: inspection, removal and bounded quarantine.

Contract:

* Every method here except :meth:`ReconcilingStore.reconcile` runs with the catalog locks
  held (inside :meth:`.base.StoreBase._mutating`) and is handed the open root descriptor.
* A reconciliation removes abandoned staging entries (one whose liveness ``flock`` can be
  taken belongs to a dead or failed commit; a live one is left alone, in any process) and
  expired states (TTL beats pinning); it moves malformed or corrupt state directories to
  ``.quarantine`` (bounded, oldest evicted first; deleted outright when the bound is zero),
  deletes entries that cannot be inspected safely and unlinks unsafe non-directory
  entries without following them.
* Cost is bounded: new, suspect and expired states are always inspected, plus a rotating
  window of ``audit_batch`` already-validated ones (every state with ``full``). Deep
  suspects get their payload hashed.
* Expired and deleted states disappear by an atomic rename into a staging name before
  their files are removed, so a crash never leaves a half-deleted state visible.
* The layer maintains ``_known``, ``_known_version`` and ``_audit_pos``, and evicts a
  removed state from the read caches.
"""

from __future__ import annotations

import fcntl
import hmac
import os
import secrets
import stat

from . import _fs, layout
from .index import IndexedStore
from .layout import (
    LOCK_NAME,
    MAX_STATE_ENTRIES,
    PAYLOAD,
    QUARANTINE,
    STAGING_PREFIX,
    STATE_FILES,
    Kind,
    Look,
    os_error,
)
from .records import PRINCIPAL_RE


class ReconcilingStore(IndexedStore):
    """Inspects, settles, removes and quarantines states; see the module contract."""

    # ------------------------------------------------------------------ inspection

    def _inspect(self, pfd: int, principal: str, sid: str, now_ms: int, *, deep: bool) -> Look:
        """Thorough inspection under the lock: entry set, types, metadata, size, optional hash."""
        st = _fs.lstat_at(sid, pfd)
        if st is None:
            return Look(Kind.ABSENT)
        if not stat.S_ISDIR(st.st_mode):
            return Look(Kind.UNSAFE)
        try:
            sfd = _fs.open_dir(sid, pfd)
        except OSError:
            return Look(Kind.UNINSPECTABLE)
        try:
            names = os.listdir(sfd)
            if len(names) > MAX_STATE_ENTRIES:
                return Look(Kind.UNINSPECTABLE)
            malformed = False
            for name in names:
                est = _fs.lstat_at(name, sfd)
                if est is None:
                    continue
                if stat.S_ISDIR(est.st_mode):
                    return Look(Kind.UNINSPECTABLE)
                if name.startswith(_fs.TMP_PREFIX):
                    os.unlink(name, dir_fd=sfd)  # an interrupted access-time write
                    continue
                if name not in STATE_FILES or not stat.S_ISREG(est.st_mode):
                    malformed = True
            if malformed:
                return Look(Kind.INVALID)
            look = self._look_in(sfd, principal, sid, now_ms)
            if look.kind == Kind.OK and deep:
                assert look.meta is not None
                fd = os.open(PAYLOAD, _fs.READ_FLAGS, dir_fd=sfd)
                try:
                    digest, size = layout.hash_fd(fd, look.meta.size)
                finally:
                    os.close(fd)
                if size != look.meta.size or not hmac.compare_digest(digest, look.meta.payload_sha256):
                    return Look(Kind.INVALID, meta=look.meta)
            return look
        except OSError:
            return Look(Kind.UNINSPECTABLE)
        finally:
            os.close(sfd)

    # ------------------------------------------------------------------ removal and quarantine

    def _remove_abandoned(self, pfd: int, name: str) -> bool:
        """Remove a staging entry unless a live commit holds its lock (a dead one cannot)."""
        st = _fs.lstat_at(name, pfd)
        if st is None:
            return False
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(name, dir_fd=pfd)
            return True
        try:
            fd = _fs.open_dir(name, pfd)
        except OSError:
            return _fs.remove_entry(name, pfd)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            return _fs.remove_entry(name, pfd)
        finally:
            os.close(fd)

    def _quarantine_fd(self, rootfd: int) -> int:
        st = _fs.lstat_at(QUARANTINE, rootfd)
        if st is not None and not stat.S_ISDIR(st.st_mode):
            os.unlink(QUARANTINE, dir_fd=rootfd)
            st = None
        if st is None:
            _fs.make_private_dir(QUARANTINE, rootfd)
            self._fsync(rootfd)
        return _fs.open_dir(QUARANTINE, rootfd)

    def _quarantine(self, rootfd: int, pfd: int, principal: str, name: str) -> None:
        """Move ``name`` into ``.quarantine`` (or delete it when retention is zero)."""
        if self._quarantine_limit == 0:
            _fs.remove_entry(name, pfd)
            self._fsync(pfd)
            return
        qfd = self._quarantine_fd(rootfd)
        try:
            qname = f"{self._now_ms():013d}-{secrets.token_hex(4)}-{principal[:8]}-{name}"[:200]
            os.rename(name, qname, src_dir_fd=pfd, dst_dir_fd=qfd)
            self._fsync(pfd)
            self._fsync(qfd)
        finally:
            os.close(qfd)

    def _enforce_quarantine(self, rootfd: int) -> None:
        st = _fs.lstat_at(QUARANTINE, rootfd)
        if st is None:
            return
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(QUARANTINE, dir_fd=rootfd)
            self._fsync(rootfd)
            return
        qfd = _fs.open_dir(QUARANTINE, rootfd)
        try:
            dirs: list[str] = []
            changed = False
            for name in os.listdir(qfd):
                est = _fs.lstat_at(name, qfd)
                if est is None:
                    continue
                if not stat.S_ISDIR(est.st_mode):
                    os.unlink(name, dir_fd=qfd)
                    changed = True
                else:
                    dirs.append(name)
            # Conforming names start with a 13-digit timestamp; anything else sorts first.
            dirs.sort(key=lambda n: (n[:13].isdigit() and n[13:14] == "-", n))
            for name in dirs[: max(0, len(dirs) - self._quarantine_limit)]:
                _fs.remove_entry(name, qfd)
                changed = True
            if changed:
                self._fsync(qfd)
        finally:
            os.close(qfd)

    def _remove_states(self, pfd: int, names: list[str]) -> None:
        """Make states disappear atomically (rename to staging), sync, then delete them."""
        doomed: list[str] = []
        for name in names:
            tmp = STAGING_PREFIX + "rm-" + secrets.token_hex(8)
            try:
                os.rename(name, tmp, src_dir_fd=pfd, dst_dir_fd=pfd)
            except FileNotFoundError:
                continue
            doomed.append(tmp)
        if doomed:
            self._fsync(pfd)
        for tmp in doomed:
            _fs.remove_entry(tmp, pfd)

    def _forget(self, principal: str, sid: str) -> None:
        self._known.get(principal, {}).pop(sid, None)
        with self._cache_lock:
            self._unsuspect((principal, sid))
            self._meta_cache.pop((principal, sid), None)
            self._la_cache.pop((principal, sid), None)
            self._look_cache.pop((principal, sid), None)

    # ------------------------------------------------------------------ reconciliation

    def _settle(self, rootfd: int, pfd: int, principal: str, sid: str, look: Look) -> bool:
        """Apply the outcome of an inspection; True when ``sid`` is a valid live state."""
        if look.kind == Kind.OK:
            assert look.meta is not None
            self._known.setdefault(principal, {})[sid] = look.meta.expires_unix_ms
            with self._cache_lock:
                self._unsuspect((principal, sid))
            return True
        if look.kind == Kind.EXPIRED:
            self._remove_states(pfd, [sid])
        elif look.kind == Kind.INVALID:
            self._quarantine(rootfd, pfd, principal, sid)
        elif look.kind == Kind.UNINSPECTABLE:
            _fs.remove_entry(sid, pfd)
            self._fsync(pfd)
        elif look.kind == Kind.UNSAFE:
            os.unlink(sid, dir_fd=pfd)
            self._fsync(pfd)
        self._forget(principal, sid)
        return False

    def _reconcile_principal(self, rootfd: int, principal: str, now_ms: int, full: bool) -> None:
        try:
            pfd = _fs.open_dir("p_" + principal, rootfd)
        except OSError:
            return
        try:
            listing = self._listing(principal, pfd, exact=True)
            changed = False
            for name in listing.staging:
                if self._remove_abandoned(pfd, name):
                    changed = True
            for name in listing.others:
                est = _fs.lstat_at(name, pfd)
                if est is None:
                    continue
                if stat.S_ISDIR(est.st_mode):
                    self._quarantine(rootfd, pfd, principal, name)
                else:
                    os.unlink(name, dir_fd=pfd)
                changed = True
            known = self._known.setdefault(principal, {})
            relisted = self._known_version.get(principal) != listing.version
            if relisted:
                for sid in [s for s in known if s not in listing.id_set]:
                    del known[sid]
                self._known_version[principal] = listing.version
            with self._cache_lock:
                suspects = {s for (p, s), _deep in self._suspects.items() if p == principal}
                deep_suspects = {s for (p, s), deep in self._suspects.items() if p == principal and deep}
            targets: dict[str, None] = {}
            for sid, exp in known.items():
                if exp is not None and exp <= now_ms:
                    targets[sid] = None
            for sid in sorted(suspects):
                targets[sid] = None
            if full:
                targets.update(dict.fromkeys(listing.ids))
            else:
                if relisted or len(known) != len(listing.ids):
                    targets.update(dict.fromkeys(s for s in listing.ids if s not in known))
                ids = listing.ids
                if ids:
                    n = min(self._audit_batch, len(ids))
                    pos = self._audit_pos.get(principal, 0) % len(ids)
                    window = ids[pos : pos + n]
                    if len(window) < n:
                        window += ids[: n - len(window)]
                    self._audit_pos[principal] = (pos + n) % len(ids)
                    targets.update(dict.fromkeys(window))
            for sid in targets:
                exp = known.get(sid)
                if exp is not None and exp <= now_ms:
                    self._remove_states(pfd, [sid])
                    self._forget(principal, sid)
                    changed = True
                    continue
                look = self._inspect(pfd, principal, sid, now_ms, deep=sid in deep_suspects)
                if not self._settle(rootfd, pfd, principal, sid, look) and look.kind != Kind.ABSENT:
                    changed = True
            if changed:
                self._fsync(pfd)
                self._rescan(principal, pfd, exact=True)
                self._known_version[principal] = self._listings[principal].version
        finally:
            os.close(pfd)

    def _reconcile_locked(self, rootfd: int, *, full: bool = False) -> None:
        now_ms = self._now_ms()
        root_changed = False
        for name in sorted(os.listdir(rootfd)):
            if name == LOCK_NAME:
                continue
            st = _fs.lstat_at(name, rootfd)
            if st is None:
                continue
            if not stat.S_ISDIR(st.st_mode):
                os.unlink(name, dir_fd=rootfd)  # unlinks a link itself, never its target
                root_changed = True
                continue
            if name.startswith("p_") and PRINCIPAL_RE.fullmatch(name[2:]):
                self._reconcile_principal(rootfd, name[2:], now_ms, full)
        if root_changed:
            self._fsync(rootfd)
        self._enforce_quarantine(rootfd)

    def reconcile(self, *, full: bool = False) -> None:
        """Run the reconciliation every real mutation runs first (under both locks).

        Removes abandoned staging entries and expired states (TTL beats pinning),
        quarantines malformed or corrupt state directories (bounded retention), deletes
        entries that cannot be inspected safely and unlinks unsafe non-directory entries
        without following them. ``full`` re-inspects every state instead of a rotating
        ``audit_batch`` window. An absent root is left absent.
        """
        try:
            with self._mutating(create=False) as rootfd:
                if rootfd is not None:
                    self._reconcile_locked(rootfd, full=full)
        except OSError as exc:
            raise os_error(exc) from exc

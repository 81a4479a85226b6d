"""Payload use: verified reads, integrity checks and access-time bookkeeping.

Contract:

* No payload byte reaches a caller unverified: :meth:`VerifyingStore.open_payload` compares
  size and SHA-256 with the metadata before yielding the file, holding a shared ``flock`` on
  it while in use (``werk cache purge`` treats such a state as active).
* Both :meth:`VerifyingStore.open_payload` and :meth:`VerifyingStore.verify` hash the file
  (bounded chunks) unless the very same file, by its :data:`.layout.PayloadKey`, was verified
  before, and remember a successful hash by that key (at most :data:`MAX_VERIFIED_CACHE`,
  least recently used forgotten first); a file changed within the racy margin, or while
  being hashed, is not remembered. Verified bytes are never hashed twice.
* The remembered verification is also durable: a *receipt* (``verified`` in the state
  directory, owner-only like every store file) records the payload key and digest of a payload
  that was hashed in full (by its commit, or by a read), so a later process opens that very,
  unchanged file without hashing it again (docs/states.md, "Integrity"); any write, ``touch``,
  truncation or replacement changes the payload key and the receipt is ignored. A receipt is
  written best effort, under the locks, and never for a file changed within the racy margin.
* A commit hashes its payload while writing it, so it remembers that digest too
  (:meth:`VerifyingStore._seal_written`): the new file's modification time is set two
  seconds in the past, so any later write moves it (whatever the filesystem's timestamp
  granularity) and changes the payload key; only a deliberate write
  that also restores that exact time within the same ctime tick could go unseen, as with any
  stat-keyed cache.
* :meth:`VerifyingStore.condemn` quarantines a state whose payload verified but which its
  producing backend found unusable (the bytes match their checksum, so only the backend can
  tell).
* A failed check marks the state suspect (hidden from this store's reads); ``verify``
  then quarantines it at once by a reconciliation under the locks, other failures leave
  that to the next mutation. Absent, expired and foreign ids are ``not_found``.
* Access times are best effort: written atomically under the locks after a successful
  read, skipped when the lock is busy or the state was replaced meanwhile.
"""

from __future__ import annotations

import contextlib
import fcntl
import hmac
import json
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from typing import BinaryIO

from werk_host.errors import WerkError, corrupt, not_found

from . import _fs, layout
from .base import ACCESS_LOCK_TIMEOUT_S
from .layout import LAST_ACCESSED, PAYLOAD, VERIFIED, Kind, PayloadKey, os_error
from .reconcile import ReconcilingStore
from .records import StateRecord, is_state_id, validate_principal

#: Bound on remembered payload verifications (least recently used ones are forgotten first).
MAX_VERIFIED_CACHE = 4096


def _payload_key(st: os.stat_result) -> PayloadKey:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def receipt_bytes(key: PayloadKey, digest: str) -> bytes:
    """A verification receipt: the payload key and digest of a verified payload."""
    return json.dumps({"payload_key": list(key), "sha256": digest}, separators=(",", ":")).encode()


def receipt_of(sfd: int) -> bytes | None:
    """The state directory's receipt, if it has a small regular one."""
    found = _fs.read_small(VERIFIED, sfd, 512)
    return found[0] if found is not None else None


def receipt_matches(receipt: bytes, key: PayloadKey, sha256: str) -> bool:
    """Whether ``receipt`` vouches for the very payload file ``key`` with digest ``sha256``."""
    try:
        doc = json.loads(receipt)
    except ValueError:
        return False
    if not isinstance(doc, dict) or not isinstance(doc.get("sha256"), str):
        return False
    return doc.get("payload_key") == list(key) and hmac.compare_digest(doc["sha256"], sha256)


class VerifyingStore(ReconcilingStore):
    """Reads payloads only after verifying them; maintains ``_verified``."""

    def _open_verified(
        self, principal: str, state_id: str
    ) -> tuple[StateRecord, int, int, tuple[PayloadKey, str] | None]:
        """Open and fully verify the payload; returns (record, fd at offset 0, state inode, the
        receipt to record after use when it was hashed now).

        The returned descriptor holds a shared ``flock`` so ``werk cache purge`` sees the
        state as active while it is in use.
        """
        validate_principal(principal)
        if not is_state_id(state_id):
            raise not_found()
        pfd = self._open_principal_ro(principal)
        if pfd is None:
            raise not_found()
        try:
            try:
                sfd = _fs.open_dir(state_id, pfd)
            except OSError:
                raise not_found() from None
            try:
                look = self._look_in(sfd, principal, state_id, self._now_ms())
                if look.kind in (Kind.ABSENT, Kind.EXPIRED):
                    raise not_found()
                with self._cache_lock:
                    deep = self._suspects.get((principal, state_id), False)
                if look.kind != Kind.OK or look.record is None or deep:
                    self._mark_suspect(principal, state_id, deep=False)
                    raise corrupt()
                rec = look.record
                try:
                    fd = os.open(PAYLOAD, _fs.READ_FLAGS, dir_fd=sfd)
                except OSError:
                    self._mark_suspect(principal, state_id, deep=False)
                    raise corrupt() from None
                ok = False
                try:
                    st = os.fstat(fd)
                    if not stat.S_ISREG(st.st_mode) or st.st_size != rec.bytes:
                        self._mark_suspect(principal, state_id, deep=False)
                        raise corrupt()
                    fcntl.flock(fd, fcntl.LOCK_SH)
                    intact, hashed = self._intact(fd, st, rec.bytes, rec.payload_sha256, receipt_of(sfd))
                    if not intact:
                        self._mark_suspect(principal, state_id, deep=True)
                        raise corrupt()
                    os.lseek(fd, 0, os.SEEK_SET)
                    ok = True
                    due = (_payload_key(st), rec.payload_sha256) if hashed else None
                    return rec, fd, os.fstat(sfd).st_ino, due
                finally:
                    if not ok:
                        os.close(fd)
            finally:
                os.close(sfd)
        except OSError as exc:
            raise os_error(exc) from exc
        finally:
            os.close(pfd)

    def _intact(
        self, fd: int, before: os.stat_result, size: int, sha256: str, receipt: bytes | None = None
    ) -> tuple[bool, bool]:
        """Whether the payload open at ``fd`` (offset 0, stat ``before``) has ``size`` bytes
        with digest ``sha256``: hashed in bounded chunks unless this very file (its payload
        key) was verified before, in this process or by the durable ``receipt`` (the state's
        ``verified`` file); a successful hash is remembered unless the file changed within the
        racy margin or while it was hashed. The second member says whether a hash was
        remembered (a receipt may then be written). Leaves the offset anywhere."""
        key = _payload_key(before)
        with self._cache_lock:
            known = self._verified.get(key)
            if known is not None:
                self._verified.move_to_end(key)
        if known is not None and hmac.compare_digest(known, sha256):
            return True, False
        if receipt is not None and receipt_matches(receipt, key, sha256):
            self._remember_verified(key, sha256)
            return True, False
        t = _fs.now_ns()
        digest, got = layout.hash_fd(fd, size)
        if got != size or not hmac.compare_digest(digest, sha256):
            return False, False
        if _fs.ident(os.fstat(fd)) == _fs.ident(before) and not _fs.racy(before, t, layout.RACY_MARGIN_NS):
            self._remember_verified(key, digest)
            return True, True
        return True, False

    def _remember_verified(self, key: PayloadKey, digest: str) -> None:
        with self._cache_lock:
            self._verified[key] = digest
            self._verified.move_to_end(key)
            while len(self._verified) > MAX_VERIFIED_CACHE:
                self._verified.popitem(last=False)

    @staticmethod
    def _seal_written(fd: int) -> PayloadKey:
        """Pin a freshly written payload's mtime two seconds in the past and return its
        payload key (see the module contract); the commit remembers its digest by
        that key once published."""
        st = os.fstat(fd)
        os.utime(fd, ns=(st.st_atime_ns, _fs.now_ns() - 2_000_000_000))
        return _payload_key(os.fstat(fd))

    @contextmanager
    def open_payload(self, principal: str, state_id: str) -> Iterator[BinaryIO]:
        """Yield the payload for reading after verifying its size and SHA-256.

        Verification happens before anything is yielded: the file is streamed through
        SHA-256 in bounded chunks unless this very file was verified before (see
        :meth:`verify`), and a mismatch is ``corrupt_state`` (and the state is quarantined by
        the next mutation). The yielded file is a real file (``fileno()`` is its verified
        descriptor, offset 0).
        Absent, expired or foreign ids are ``not_found``. When the block exits without an
        exception, ``last-accessed`` is recorded.
        """
        rec, fd, ino, due = self._open_verified(principal, state_id)
        f = os.fdopen(fd, "rb")
        try:
            yield f
        finally:
            f.close()
        if due is not None:
            self._record_receipt(principal, rec.id, ino, *due)
        self._record_access(principal, rec.id, ino)

    def verify(self, principal: str, state_id: str) -> bool:
        """Whether the state's payload matches its metadata (size and SHA-256).

        ``True``: the payload is intact. A verification is remembered by the payload file's
        (st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns), for at most
        :data:`MAX_VERIFIED_CACHE` files, so an unchanged file is hashed once; any write,
        ``touch`` or replacement changes that key and forces a new hash. A file changed
        within the racy margin before its hash, or during it, is not remembered.

        ``False``: the state failed integrity validation (payload, metadata or a failed
        earlier hash); it is quarantined before this returns, by a reconciliation under the
        locks. If the catalog lock cannot be had within 5 s the state stays hidden from this
        store's reads and the next mutation quarantines it.

        Absent, expired or foreign ids are ``not_found``. Safe to call from many threads.
        """
        validate_principal(principal)
        if not is_state_id(state_id):
            raise not_found()
        pfd = self._open_principal_ro(principal)
        if pfd is None:
            raise not_found()
        try:
            intact = self._verify_in(pfd, principal, state_id)
        except OSError as exc:
            raise os_error(exc) from exc
        finally:
            os.close(pfd)
        if not intact:
            self._mark_suspect(principal, state_id, deep=True)
            with (
                contextlib.suppress(OSError, WerkError),
                self._mutating(create=False, strict=False, timeout=ACCESS_LOCK_TIMEOUT_S) as rootfd,
            ):
                if rootfd is not None:
                    self._reconcile_locked(rootfd)  # deep-inspects the suspect and quarantines it
        return intact

    def _verify_in(self, pfd: int, principal: str, sid: str) -> bool:
        try:
            sfd = _fs.open_dir(sid, pfd)
        except OSError:
            raise not_found() from None
        try:
            look = self._look_in(sfd, principal, sid, self._now_ms())
            if look.kind in (Kind.ABSENT, Kind.EXPIRED):
                raise not_found()
            with self._cache_lock:
                deep = self._suspects.get((principal, sid), False)
            if look.kind != Kind.OK or look.meta is None or deep:
                return False
            meta = look.meta
            try:
                fd = os.open(PAYLOAD, _fs.READ_FLAGS, dir_fd=sfd)
            except OSError:
                return False
            receipt, ino = receipt_of(sfd), os.fstat(sfd).st_ino
        finally:
            os.close(sfd)
        try:
            before = os.fstat(fd)
            if not stat.S_ISREG(before.st_mode) or before.st_size != meta.size:
                return False
            intact, hashed = self._intact(fd, before, meta.size, meta.payload_sha256, receipt)
        finally:
            os.close(fd)
        if hashed:
            self._record_receipt(principal, sid, ino, _payload_key(before), meta.payload_sha256)
        return intact

    def condemn(self, principal: str, state_id: str) -> bool:
        """Quarantine a state at once, under the locks: its payload verified, but the backend
        that produced it found it unusable (a rejected or mis-acknowledged restore).

        ``False`` when the state is absent or the catalog does not exist. From then on it is
        neither listed nor offered for reuse."""
        validate_principal(principal)
        if not is_state_id(state_id):
            return False
        try:
            with self._mutating(create=False) as rootfd:
                if rootfd is None:
                    return False
                pfd = self._principal_fd(rootfd, principal, create=False)
                if pfd is None:
                    return False
                try:
                    st = _fs.lstat_at(state_id, pfd)
                    if st is None or not stat.S_ISDIR(st.st_mode):
                        return False
                    self._quarantine(rootfd, pfd, principal, state_id)
                    self._forget(principal, state_id)
                    self._rescan(principal, pfd, exact=True)
                    return True
                finally:
                    os.close(pfd)
        except OSError as exc:
            raise os_error(exc) from exc

    def _record_receipt(self, principal: str, sid: str, ino: int, key: PayloadKey, digest: str) -> None:
        """Best effort: write the state's verification receipt atomically under the lock."""
        try:
            with self._mutating(create=False, strict=False, timeout=ACCESS_LOCK_TIMEOUT_S) as rootfd:
                if rootfd is None:
                    return
                pfd = _fs.open_dir("p_" + principal, rootfd)
                try:
                    sfd = _fs.open_dir(sid, pfd)
                    try:
                        if os.fstat(sfd).st_ino == ino:
                            _fs.replace_file(VERIFIED, sfd, receipt_bytes(key, digest), durable=False)
                    finally:
                        os.close(sfd)
                finally:
                    os.close(pfd)
        except (OSError, WerkError):
            return

    def _record_access(self, principal: str, sid: str, ino: int) -> None:
        """Best effort: write ``last-accessed`` atomically under the lock (no reconcile)."""
        try:
            with self._mutating(create=False, strict=False, timeout=ACCESS_LOCK_TIMEOUT_S) as rootfd:
                if rootfd is None:
                    return
                pfd = _fs.open_dir("p_" + principal, rootfd)
                try:
                    sfd = _fs.open_dir(sid, pfd)
                    try:
                        if os.fstat(sfd).st_ino != ino:
                            return
                        _fs.replace_file(LAST_ACCESSED, sfd, str(self._now_ms()).encode(), durable=False)
                    finally:
                        os.close(sfd)
                finally:
                    os.close(pfd)
        except (OSError, WerkError):
            return

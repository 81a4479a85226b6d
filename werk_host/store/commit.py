"""The commit path: staging, streaming while hashing, the storage bounds and atomic publication.

Contract:

* A commit creates a ``.staging-*`` directory under the locks (after a reconciliation and a
  first check of the storage bounds, :mod:`.quota`), holds an exclusive ``flock`` on it (its
  liveness lock), streams the payload into it *outside* the catalog lock while hashing it in
  the same pass, and publishes it under the locks again: bounds checked once more, metadata
  written, files and directory fsynced, the staging directory renamed to ``st_<random id>``
  and the parent fsynced.
* On any failure (a refused bound, ``ENOSPC`` at any step, a digest mismatch, an exception
  from the payload's source) the staging directory is removed before the error propagates,
  so a failed commit leaves no entry behind; a crash leaves only a staging entry, which the
  next reconciliation removes. Nothing is visible before the rename.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import os
import secrets
from collections.abc import Iterable
from typing import Any, BinaryIO

from werk_host.errors import corrupt, exhausted, internal, invalid

from . import _fs
from .layout import CHECKSUM, CHUNK, META, PAYLOAD, PINNED, STAGING_PREFIX, VERIFIED, dev_ino, forbidden, os_error
from .quota import QuotaStore, footprint, refusal
from .records import (
    MAX_FINGERPRINT,
    MAX_METADATA_BYTES,
    MAX_TTL_SECONDS,
    SHA256_RE,
    Metadata,
    StateRecord,
    checksum_text,
    validate_adapter_meta,
    validate_compat_key,
    validate_name,
    validate_principal,
)
from .verify import VerifyingStore, receipt_bytes


class CommittingStore(VerifyingStore, QuotaStore):
    """Publishes new states (module contract)."""

    def _stream_payload(
        self, fd: int, payload: BinaryIO | Iterable[bytes | bytearray | memoryview], room: int
    ) -> tuple[int, str]:
        """Write and hash ``payload``; at most ``max_payload_bytes``, and at most ``room`` (the
        footprint still free under the storage bounds, quota.py) before anything is published."""
        h = hashlib.sha256()
        total = 0

        def take(chunk: bytes | bytearray | memoryview) -> None:
            nonlocal total
            n = memoryview(chunk).nbytes
            if total + n > self._max_payload:
                raise exhausted("the state payload exceeds the configured size bound", retryable=False)
            if total + n > room:
                raise refusal("this state would exceed the storage bound of this key or of the store")
            h.update(chunk)
            _fs.write_all(fd, chunk)
            total += n

        readinto = getattr(payload, "readinto", None)
        read = getattr(payload, "read", None)
        if callable(readinto):
            view = memoryview(bytearray(CHUNK))
            while True:
                n = readinto(view)
                if n is None:
                    raise invalid("the payload stream must be blocking")
                if n == 0:
                    break
                take(view[:n])
        elif callable(read):
            while True:
                chunk = read(CHUNK)
                if not chunk:
                    break
                if not isinstance(chunk, bytes | bytearray | memoryview):
                    raise invalid("the payload stream must yield bytes")
                take(chunk)
        else:
            for chunk in payload:
                if not isinstance(chunk, bytes | bytearray | memoryview):
                    raise invalid("payload chunks must be bytes")
                if chunk:
                    take(chunk)
        return total, h.hexdigest()

    def commit(
        self,
        principal: str,
        *,
        model_id: str,
        backend: str,
        compat_key: dict[str, str],
        payload: BinaryIO | Iterable[bytes | bytearray | memoryview],
        prompt_fingerprint: str | None = None,
        prompt_tokens: int | None = None,
        ttl_seconds: int | None = None,
        pinned: bool = False,
        adapter_meta: dict[str, Any] | None = None,
        expected_sha256: str | None = None,
    ) -> StateRecord:
        """Durably publish a new state and return its record.

        Under the locks it reconciles and creates a same-directory staging entry (held by
        a liveness ``flock``); it then streams the payload in 1 MiB chunks while computing
        its SHA-256 in the same pass, without holding the catalog lock (never buffered
        whole; more than ``max_payload_bytes`` is ``resource_exhausted``); finally, under
        the locks again, it writes the metadata, fsyncs files and directory, renames the
        staging directory atomically to ``st_<random id>`` and fsyncs the parent; the digest
        it computed is remembered as verified (see :mod:`.verify`). A
        mismatching ``expected_sha256`` is ``corrupt_state`` and publishes nothing. On any
        failure, or a crash at any point, nothing becomes visible.
        """
        validate_principal(principal)
        validate_name(model_id, "model_id")
        validate_name(backend, "backend")
        env = validate_compat_key(compat_key)
        meta_extra = validate_adapter_meta(adapter_meta)
        if prompt_fingerprint is not None and (
            not isinstance(prompt_fingerprint, str) or not 0 < len(prompt_fingerprint) <= MAX_FINGERPRINT
        ):
            raise invalid("prompt_fingerprint must be a short string")
        if prompt_tokens is not None and (
            not isinstance(prompt_tokens, int) or isinstance(prompt_tokens, bool) or prompt_tokens < 0
        ):
            raise invalid("prompt_tokens must be a non-negative integer")
        if ttl_seconds is not None and (
            not isinstance(ttl_seconds, int) or isinstance(ttl_seconds, bool) or not 1 <= ttl_seconds <= MAX_TTL_SECONDS
        ):
            raise invalid("ttl_seconds must be between 1 and 2592000")
        if expected_sha256 is not None and (
            not isinstance(expected_sha256, str) or not SHA256_RE.fullmatch(expected_sha256)
        ):
            raise invalid("expected_sha256 must be 64 lowercase hex characters")
        probe = Metadata(
            state_id="st_" + "0" * 32,
            principal=principal,
            model_id=model_id,
            backend=backend,
            size=self._max_payload,
            payload_sha256="0" * 64,
            created_unix_ms=10**15,
            expires_unix_ms=10**15,
            compat_key=env,
            prompt_fingerprint=prompt_fingerprint,
            prompt_tokens=prompt_tokens,
            adapter_meta=meta_extra,
        )
        if len(probe.encode()) > MAX_METADATA_BYTES:
            raise invalid("state metadata exceeds its size bound")
        try:
            pfd, sfd, staging, root_id, room = self._begin_commit(principal)
        except OSError as exc:
            raise os_error(exc) from exc
        try:
            try:
                # Streaming runs without the catalog lock; the flock on the staging directory
                # marks it live, so no reconciliation (in any process) removes it meanwhile.
                pay = os.open(PAYLOAD, _fs.CREATE_FLAGS, _fs.FILE_MODE, dir_fd=sfd)
                try:
                    os.fchmod(pay, _fs.FILE_MODE)
                    size, digest = self._stream_payload(pay, payload, room)
                    written = self._seal_written(pay)
                    if self._durable:
                        os.fsync(pay)
                finally:
                    os.close(pay)
                if expected_sha256 is not None and not hmac.compare_digest(digest, expected_sha256):
                    raise corrupt("the state payload does not match its expected SHA-256")
                # hashed while written: a later process need not hash it again (verify.py)
                _fs.replace_file(VERIFIED, sfd, receipt_bytes(written, digest), durable=self._durable)
                with self._mutating(create=False) as rootfd:
                    if rootfd is None or dev_ino(os.fstat(rootfd)) != root_id:
                        raise forbidden()
                    record = self._publish_locked(
                        rootfd,
                        pfd,
                        sfd,
                        staging,
                        principal,
                        model_id=model_id,
                        backend=backend,
                        compat_key=env,
                        size=size,
                        digest=digest,
                        prompt_fingerprint=prompt_fingerprint,
                        prompt_tokens=prompt_tokens,
                        ttl_seconds=ttl_seconds,
                        pinned=bool(pinned),
                        adapter_meta=meta_extra,
                    )
            except BaseException:
                with contextlib.suppress(OSError):
                    _fs.remove_entry(staging, pfd)  # still ours: we hold its liveness lock
                raise
            finally:
                os.close(sfd)
                os.close(pfd)
        except OSError as exc:
            raise os_error(exc) from exc
        self._remember_verified(written, digest)  # hashed while written: never hashed again
        return record

    def _begin_commit(self, principal: str) -> tuple[int, int, str, tuple[int, int], int]:
        """Under the locks: reconcile, check the storage bounds, then create and flock a fresh
        staging directory (removed again at once if that fails).

        Returns (principal fd, staging fd holding ``LOCK_EX``, staging name, root dev/ino, the
        footprint still free under the storage bounds).
        """
        with self._mutating(create=True) as rootfd:
            assert rootfd is not None
            self._reconcile_locked(rootfd)
            pfd = self._principal_fd(rootfd, principal, create=True)
            assert pfd is not None
            staging: str | None = None
            try:
                room = self._admit_locked(rootfd, principal, pfd, 0)
                name = STAGING_PREFIX + secrets.token_hex(8)
                before = self._listing(principal, pfd, exact=True)
                before_ident = _fs.ident(os.fstat(pfd))
                _fs.make_private_dir(name, pfd)
                staging = name
                self._stamp(principal, pfd, before, before_ident, add_staging=staging)
                sfd = _fs.open_dir(staging, pfd)
                try:
                    fcntl.flock(sfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BaseException:
                    os.close(sfd)
                    raise
                return pfd, sfd, staging, dev_ino(os.fstat(rootfd)), room
            except BaseException:
                if staging is not None:
                    with contextlib.suppress(OSError):
                        _fs.remove_entry(staging, pfd)
                os.close(pfd)
                raise

    def _publish_locked(
        self,
        rootfd: int,
        pfd: int,
        sfd: int,
        staging: str,
        principal: str,
        *,
        model_id: str,
        backend: str,
        compat_key: dict[str, str],
        size: int,
        digest: str,
        prompt_fingerprint: str | None,
        prompt_tokens: int | None,
        ttl_seconds: int | None,
        pinned: bool,
        adapter_meta: dict[str, Any],
    ) -> StateRecord:
        """Under the locks: write metadata, fsync, rename staging to a fresh id, fsync parent."""
        pst = _fs.lstat_at("p_" + principal, rootfd)
        if pst is None or dev_ino(pst) != dev_ino(os.fstat(pfd)):
            raise forbidden("the principal directory changed during the commit")
        sst = _fs.lstat_at(staging, pfd)
        if sst is None or dev_ino(sst) != dev_ino(os.fstat(sfd)):
            raise internal("the staging entry vanished during the commit")
        now_ms = self._now_ms()
        sid = "st_" + secrets.token_hex(16)
        while _fs.lstat_at(sid, pfd) is not None:
            sid = "st_" + secrets.token_hex(16)
        meta = Metadata(
            state_id=sid,
            principal=principal,
            model_id=model_id,
            backend=backend,
            size=size,
            payload_sha256=digest,
            created_unix_ms=now_ms,
            expires_unix_ms=None if ttl_seconds is None else now_ms + ttl_seconds * 1000,
            compat_key=compat_key,
            prompt_fingerprint=prompt_fingerprint,
            prompt_tokens=prompt_tokens,
            adapter_meta=adapter_meta,
        )
        data = meta.encode()
        size_on_disk = footprint(meta, data)
        self._admit_locked(rootfd, principal, pfd, size_on_disk)  # under the lock, right before publishing
        _fs.write_new_file(META, sfd, data, durable=self._durable)
        _fs.write_new_file(CHECKSUM, sfd, checksum_text(data), durable=self._durable)
        if pinned:
            _fs.write_new_file(PINNED, sfd, b"", durable=self._durable)
        self._fsync(sfd)
        before = self._listing(principal, pfd, exact=True)
        before_ident = _fs.ident(os.fstat(pfd))
        os.rename(staging, sid, src_dir_fd=pfd, dst_dir_fd=pfd)
        self._fsync(pfd)
        self._known.setdefault(principal, {})[sid] = meta.expires_unix_ms
        self._stamp(principal, pfd, before, before_ident, add_id=sid, drop_staging=staging)
        self._known_version[principal] = self._listings[principal].version
        self._charge(principal, sid, size_on_disk, before.version, self._listings[principal].version)
        return meta.record(pinned=pinned, last_accessed_unix_ms=None)

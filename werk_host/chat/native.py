"""Native session snapshots on disk and the rules for using them (docs/chat.md, "Native snapshots").

Files, in the session's private ``native/`` directory (0700; files 0600, never through a link)::

    snapshot-<sha16>.bin   the backend's opaque snapshot bytes
    snapshot.json          index: session key (member ``envelope``), file name, SHA-256, size, acknowledgements
    capability.json        receipt: observed restored reuse under one exact session key

Rules (docs/chat.md, "Native snapshots"):

* **No snapshot, no restore work.** Opening a session reads the index and receipt only; it never
  runs a synthetic prompt. :meth:`NativeCache.open` reports ``available`` (no usable snapshot),
  ``unverified`` (a snapshot, no receipt for this session key) or ``verified`` (a receipt records
  observed reuse under this exact session key: historical evidence, not a promise of a hit).
* **Verified before use, restored on the first real request.** The index's session key must equal
  the backend's current one exactly; the file must be a private regular file of the recorded
  size whose SHA-256 matches, checked on the open descriptor before the backend gets it; the
  backend checks its own restore acknowledgements (:class:`~werk_host.chat.seam.SessionSlot`).
* **Restore failure** deletes the receipt and the snapshot; the backend has cleared its slot; the
  request goes on with the whole conversation from the archive (a full prefill), so the output is
  exactly what no snapshot would give.
* **Observed reuse** is recorded only for the first request after a restore, only from a
  complete response whose backend cache count is positive and consistent (≤ prompt tokens). A
  zero count is a cache miss, not proof of a broken restore; missing or inconsistent counts leave
  reuse unverified; later live-slot hits prove nothing about the disk.
* **Saving** happens only after a complete response: the bytes are hashed in the same pass that
  writes them, fsynced, then the index is replaced atomically; an interrupted or failed response
  publishes nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import re
import secrets
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import BinaryIO, Final

from werk_host.chat.archive import private_to_user
from werk_host.chat.seam import SessionSlot
from werk_host.errors import ErrorCode, WerkError
from werk_host.seam import JsonObject, Snapshot, StoredStateRef
from werk_host.store._fs import (
    CREATE_FLAGS,
    FILE_MODE,
    READ_FLAGS,
    TMP_PREFIX,
    fsync_fd,
    open_dir,
    read_small,
    remove_entry,
    replace_file,
    write_all,
)
from werk_host.store.layout import hash_fd

INDEX_NAME: Final = "snapshot.json"
RECEIPT_NAME: Final = "capability.json"
INDEX_SCHEMA: Final = "werk-chat-snapshot/1"
RECEIPT_SCHEMA: Final = "werk-chat-reuse-receipt/1"
MAX_INDEX_BYTES: Final = 64 << 10
MAX_RECEIPT_BYTES: Final = 16 << 10
#: The largest snapshot saved or restored; a bigger one is not published.
MAX_SNAPSHOT_BYTES: Final = 32 << 30
_SNAPSHOT_FILE = re.compile(r"^snapshot-[0-9a-f]{16}\.bin$")


class NativeStatus(StrEnum):
    """What ``werk chat``/``werk run`` say about native cache reuse when a session opens."""

    UNAVAILABLE = "unavailable"
    AVAILABLE = "available"
    UNVERIFIED = "unverified"
    VERIFIED = "verified"


@dataclass(frozen=True)
class NativeReport:
    status: NativeStatus
    detail: str


@dataclass(frozen=True)
class RestoreOutcome:
    """A first-request restore: ``tokens`` restored, or ``error`` (then the conversation is rebuilt)."""

    tokens: int | None
    seconds: float
    error: str | None = None


@dataclass(frozen=True)
class CommitOutcome:
    """After a response: the backend's cache count, what it proves, and the saved snapshot."""

    cached_tokens: int | None
    prompt_tokens: int | None
    evidence: str | None
    observed: bool
    saved_bytes: int | None
    save_seconds: float
    save_error: str | None = None


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _string_map(value: object) -> dict[str, str] | None:
    if isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        return dict(value)
    return None


def _read_json(dir_fd: int, name: str, limit: int) -> dict[str, object] | None:
    """A small private JSON object file, or ``None`` when absent, unsafe, oversized or malformed."""
    found = read_small(name, dir_fd, limit)
    if found is None:
        return None
    data, st = found
    if not private_to_user(st):
        return None
    try:
        doc = json.loads(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


def mismatched(recorded: dict[str, str], current: dict[str, str]) -> list[str]:
    """The session key dimensions (names only) on which two session keys differ."""
    return sorted(k for k in set(recorded) | set(current) if recorded.get(k) != current.get(k))


@dataclass(frozen=True)
class SavedSessionIndex:
    session_key: dict[str, str]
    file: str
    sha256: str
    size: int
    backend_meta: JsonObject

    @classmethod
    def parse(cls, doc: dict[str, object] | None) -> SavedSessionIndex | None:
        if doc is None or doc.get("schema") != INDEX_SCHEMA:
            return None
        session_key, name, digest, size = doc.get("envelope"), doc.get("file"), doc.get("sha256"), doc.get("bytes")
        meta = doc.get("backend_meta", {})
        env = _string_map(session_key)
        if env is None or not isinstance(name, str) or not _SNAPSHOT_FILE.fullmatch(name):
            return None
        if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
            return None
        if not _positive_int(size) or not isinstance(meta, dict):
            return None
        assert isinstance(size, int)
        return cls(env, name, digest, size, meta)

    def encode(self) -> bytes:
        doc = {
            "schema": INDEX_SCHEMA,
            "envelope": self.session_key,
            "file": self.file,
            "sha256": self.sha256,
            "bytes": self.size,
            "backend_meta": self.backend_meta,
            "saved_unix_ms": int(time.time() * 1000),
        }
        return json.dumps(doc, sort_keys=True).encode()


class NativeCache:
    """The native snapshot of one session directory over one backend's :class:`SessionSlot`."""

    def __init__(self, directory: Path, slot: SessionSlot) -> None:
        self.directory = directory
        self.slot = slot
        self.session_key: dict[str, str] | None = None
        self._pending: SavedSessionIndex | None = None
        self._awaiting_evidence = False

    @contextlib.contextmanager
    def _dir(self) -> Iterator[int]:
        fd = open_dir(str(self.directory), None)
        try:
            yield fd
        finally:
            os.close(fd)

    # -- open: read-only, no restore work ---------------------------------------------------
    def open(self) -> NativeReport:
        """Say what the session's native cache can do; reads small files only, runs nothing."""
        try:
            self.session_key = self.slot.session_key()
        except WerkError as err:
            return NativeReport(NativeStatus.UNAVAILABLE, f"the backend cannot identify its runtime ({err.message})")
        with self._dir() as fd:
            index = SavedSessionIndex.parse(_read_json(fd, INDEX_NAME, MAX_INDEX_BYTES))
            receipt = _read_json(fd, RECEIPT_NAME, MAX_RECEIPT_BYTES)
        if index is None:
            return NativeReport(NativeStatus.AVAILABLE, "no snapshot yet; the first complete response is saved")
        differ = mismatched(index.session_key, self.session_key)
        if differ:
            return NativeReport(
                NativeStatus.AVAILABLE,
                f"the saved snapshot was made under another runtime configuration ({', '.join(differ)}); "
                "it is not used, the conversation is re-read and a new snapshot saved",
            )
        self._pending = index
        observed = self._receipt_time(receipt)
        if observed is not None:
            return NativeReport(
                NativeStatus.VERIFIED,
                f"observed restored reuse is on record for this exact runtime ({observed}); "
                "the snapshot is checked and restored on the first request",
            )
        return NativeReport(
            NativeStatus.UNVERIFIED,
            "a snapshot is checked and restored on the first request; no observed reuse is on record for this runtime",
        )

    def _receipt_time(self, receipt: dict[str, object] | None) -> str | None:
        if receipt is None or receipt.get("schema") != RECEIPT_SCHEMA or self.session_key is None:
            return None
        session_key = _string_map(receipt.get("envelope"))
        when, cached = receipt.get("observed_unix_ms"), receipt.get("cached_tokens")
        if session_key != self.session_key or not _positive_int(when) or not _positive_int(cached) or cached == 0:
            return None
        assert isinstance(when, int)
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(when / 1000))

    # -- the first real request ---------------------------------------------------------------
    def restore_if_pending(self) -> RestoreOutcome | None:
        """Verify and restore the session's snapshot before the first real request (``None``:
        nothing to restore). A failure invalidates the receipt and removes the snapshot."""
        index, self._pending = self._pending, None
        if index is None:
            return None
        started = time.monotonic()
        try:
            stored = StoredStateRef(
                state_id=self.directory.parent.name,
                compat_key=index.session_key,
                prompt_tokens=None,
                bytes=index.size,
                adapter_meta=index.backend_meta,
                open_payload=lambda: self._open_verified(index),
            )
            tokens = self.slot.restore(stored)
        except WerkError as err:
            self.invalidate()
            return RestoreOutcome(None, time.monotonic() - started, err.message)
        self._awaiting_evidence = True
        return RestoreOutcome(tokens, time.monotonic() - started)

    @contextlib.contextmanager
    def _open_verified(self, index: SavedSessionIndex) -> Iterator[BinaryIO]:
        """The snapshot file, opened without following a link, checked to be a private regular
        file of the recorded size whose SHA-256 matches, before it is handed over (a real file:
        the backend may pass its descriptor on, so the checked inode is the one it reads)."""
        with self._dir() as dfd:
            try:
                fd = os.open(index.file, READ_FLAGS, dir_fd=dfd)
            except OSError as err:
                raise WerkError(ErrorCode.CORRUPT_STATE, "the native snapshot file is missing or unsafe") from err
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or not private_to_user(st):
                raise WerkError(ErrorCode.CORRUPT_STATE, "the native snapshot is not a private regular file")
            if st.st_size != index.size or st.st_size > MAX_SNAPSHOT_BYTES:
                raise WerkError(ErrorCode.CORRUPT_STATE, "the native snapshot's size does not match its index")
            os.set_blocking(fd, True)
            digest, read = hash_fd(fd, index.size)
            if read != index.size or not hmac.compare_digest(digest, index.sha256):
                raise WerkError(ErrorCode.CORRUPT_STATE, "the native snapshot does not match its SHA-256")
            os.lseek(fd, 0, os.SEEK_SET)
            payload = os.fdopen(fd, "rb")
        except BaseException:
            os.close(fd)
            raise
        with payload:
            yield payload

    # -- after a response -----------------------------------------------------------------------
    def commit(self, usage_event: JsonObject | None, *, complete: bool) -> CommitOutcome:
        """Record what a finished response proves and save the slot after a complete one."""
        first_after_restore, self._awaiting_evidence = self._awaiting_evidence, False
        if not complete:
            return CommitOutcome(None, None, None, False, None, 0.0)
        usage = usage_event.get("usage") if usage_event is not None else None
        prompt = usage.get("prompt_tokens") if isinstance(usage, dict) else None
        prompt_tokens = prompt if _positive_int(prompt) else None
        assert prompt_tokens is None or isinstance(prompt_tokens, int)
        cached = self.slot.cached_tokens(usage_event) if usage_event is not None else None
        consistent = cached is not None and prompt_tokens is not None and 0 <= cached <= prompt_tokens
        evidence: str | None = None
        observed = False
        if first_after_restore:
            if consistent and cached:
                observed = self._write_receipt(cached, prompt_tokens)
                evidence = (
                    f"native KV restored reuse observed: {cached} of {prompt_tokens} prompt tokens from the cache"
                )
            elif consistent:
                evidence = "no cached tokens after the restore: a cache miss, not proof of a broken restore"
            else:
                evidence = "the backend's cache count is missing or inconsistent: reuse stays unverified"
        started = time.monotonic()
        try:
            saved = self._save()
        except (WerkError, OSError) as err:
            message = err.message if isinstance(err, WerkError) else type(err).__name__
            return CommitOutcome(
                cached, prompt_tokens, evidence, observed, None, time.monotonic() - started, save_error=message
            )
        return CommitOutcome(cached, prompt_tokens, evidence, observed, saved, time.monotonic() - started)

    def _write_receipt(self, cached: int, prompt_tokens: int | None) -> bool:
        if self.session_key is None:
            return False
        doc = {
            "schema": RECEIPT_SCHEMA,
            "envelope": self.session_key,
            "observed_unix_ms": int(time.time() * 1000),
            "cached_tokens": cached,
            "prompt_tokens": prompt_tokens,
        }
        with self._dir() as fd:
            replace_file(RECEIPT_NAME, fd, json.dumps(doc, sort_keys=True).encode(), durable=True)
            fsync_fd(fd)
        return True

    def _save(self) -> int:
        """Stream the backend's snapshot into a new private file (hashed in the same pass),
        fsync it, publish the index atomically, then drop older snapshot files."""
        if self.session_key is None:
            raise WerkError(ErrorCode.UNAVAILABLE, "the backend's session key is unknown")
        snapshot: Snapshot = self.slot.save()
        tmp = f"{TMP_PREFIX}{secrets.token_hex(8)}"
        digest = hashlib.sha256()
        size = 0
        with self._dir() as dfd:
            try:
                fd = os.open(tmp, CREATE_FLAGS, FILE_MODE, dir_fd=dfd)
                try:
                    os.fchmod(fd, FILE_MODE)
                    for chunk in snapshot.chunks:
                        size += len(chunk)
                        if size > MAX_SNAPSHOT_BYTES:
                            raise WerkError(ErrorCode.RESOURCE_EXHAUSTED, "the native snapshot is over the size bound")
                        digest.update(chunk)
                        write_all(fd, chunk)
                    os.fsync(fd)
                finally:
                    os.close(fd)
                if snapshot.size is not None and snapshot.size != size:
                    raise WerkError(ErrorCode.INTERNAL, "the backend's snapshot size does not match its bytes")
                sha = digest.hexdigest()
                name = f"snapshot-{sha[:16]}.bin"
                os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
                assert self.session_key is not None
                index = SavedSessionIndex(self.session_key, name, sha, size, dict(snapshot.adapter_meta))
                replace_file(INDEX_NAME, dfd, index.encode(), durable=True)
                fsync_fd(dfd)
                for other in os.listdir(dfd):
                    if other != name and (_SNAPSHOT_FILE.fullmatch(other) or other.startswith(TMP_PREFIX)):
                        remove_entry(other, dfd)
            finally:
                snapshot.close()
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=dfd)
        return size

    # -- cleanup ---------------------------------------------------------------------------------
    def invalidate(self, *, receipt: bool = True) -> None:
        """Forget the snapshot, and with ``receipt`` the receipt too (a restore failed); a reset
        conversation keeps the receipt, which is evidence about the runtime, not the conversation."""
        self._pending = None
        self._awaiting_evidence = False
        doomed = {INDEX_NAME, RECEIPT_NAME} if receipt else {INDEX_NAME}
        with self._dir() as fd:
            for name in os.listdir(fd):
                if name in doomed or _SNAPSHOT_FILE.fullmatch(name) or name.startswith(TMP_PREFIX):
                    remove_entry(name, fd)
            fsync_fd(fd)


__all__ = [
    "INDEX_NAME",
    "MAX_SNAPSHOT_BYTES",
    "RECEIPT_NAME",
    "CommitOutcome",
    "NativeCache",
    "NativeReport",
    "NativeStatus",
    "RestoreOutcome",
    "SavedSessionIndex",
    "mismatched",
]

"""The durable runtime-state catalog under ``WERK_HOME/runtime-state/v1``.

Layout (exact)::

    runtime-state/v1/
    ├── .lock                       advisory lock (filelock) shared by every writer
    ├── .quarantine/                bounded: malformed or corrupt state directories
    └── p_<principal>/              opaque lowercase-hex principal (already an HMAC)
        └── st_<32 hex>/            random id, never derived from a prompt
            ├── metadata.json       canonical JSON, immutable after commit
            ├── metadata.sha256     hex SHA-256 of metadata.json
            ├── payload.bin         the adapter's opaque bytes
            ├── last-accessed       unix ms, written after a successful load
            └── pinned              present only when pinned

Contracts:

* Constructing a store creates nothing. Only :meth:`StateStore.commit` creates the tree.
* Reads (:meth:`get`, :meth:`list`, :meth:`find_by_fingerprint`, :meth:`inventory`, the
  dry runs of :meth:`prune` and :meth:`purge`) take no file lock and create, repair,
  touch, quarantine or delete nothing; invalid or expired entries are omitted.
  :meth:`verify` is read-only while the payload is intact; a payload that fails
  verification is quarantined at once, by a reconciliation under the locks.
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
import builtins
import contextlib
import dataclasses
import errno
import fcntl
import hashlib
import hmac
import itertools
import os
import secrets
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import filelock

from werk_host.errors import (
    ErrorCode,
    WerkError,
    corrupt,
    exhausted,
    internal,
    invalid,
    not_found,
    unavailable,
)

from . import _fs
from .records import (
    DISK_TIER,
    KNOWN_TIERS,
    MAX_FINGERPRINT,
    MAX_METADATA_BYTES,
    MAX_TTL_SECONDS,
    PRINCIPAL_RE,
    SHA256_RE,
    STATE_ID_RE,
    InventoryEntry,
    Metadata,
    PruneOutcome,
    PurgeOutcome,
    ReconcileReport,
    StateRecord,
    checksum_text,
    decode_metadata,
    is_state_id,
    validate_adapter_meta,
    validate_envelope,
    validate_name,
    validate_principal,
)

CHUNK = 1 << 20
LOCK_NAME = ".lock"
QUARANTINE = ".quarantine"
STAGING_PREFIX = ".staging-"
TMP_PREFIX = _fs.TMP_PREFIX
META = "metadata.json"
CHECKSUM = "metadata.sha256"
PAYLOAD = "payload.bin"
LAST_ACCESSED = "last-accessed"
PINNED = "pinned"
STATE_FILES = frozenset({META, CHECKSUM, PAYLOAD, LAST_ACCESSED, PINNED})
#: A state directory with more entries than this cannot be inspected safely: it is deleted.
MAX_STATE_ENTRIES = 16
MAX_PAGE = 100
MAX_IDS_PER_OPERATION = 100
#: Changes younger than this are not trusted to be visible in a directory's timestamps.
RACY_MARGIN_NS = 100_000_000
_MAX_META_CACHE = 200_000
#: Bound on remembered payload verifications (least recently used ones are forgotten first).
MAX_VERIFIED_CACHE = 4096

_OK, _ABSENT, _INVALID, _EXPIRED = "ok", "absent", "invalid", "expired"
_UNSAFE, _UNINSPECTABLE = "unsafe", "uninspectable"


def forbidden(message: str = "the runtime-state directory is unsafe") -> WerkError:
    return WerkError(ErrorCode.FORBIDDEN, message)


# One process mutex and one FileLock object per catalog root, shared by every store
# instance in the process (two instances must not deadlock on their own flock).
_REGISTRY: dict[str, tuple[threading.RLock, filelock.BaseFileLock]] = {}
_REGISTRY_GUARD = threading.Lock()


def _locks_for(root: Path) -> tuple[threading.RLock, filelock.BaseFileLock]:
    key = str(root)
    with _REGISTRY_GUARD:
        found = _REGISTRY.get(key)
        if found is None:
            lock = filelock.FileLock(str(root / LOCK_NAME), mode=0o600, thread_local=False)
            found = (threading.RLock(), lock)
            _REGISTRY[key] = found
        return found


@dataclass
class _Listing:
    """Sorted state ids of one principal directory, valid for ``ident``."""

    ident: _fs.Ident
    trusted: bool
    ids: list[str]
    id_set: frozenset[str]
    staging: list[str]
    others: list[str]
    version: int


@dataclass
class _Look:
    kind: str
    record: StateRecord | None = None
    meta: Metadata | None = None
    pinned: bool = False
    payload_ident: _fs.Ident | None = None


@dataclass
class _FpIndex:
    version: int
    fp_of: dict[str, str | None] = field(default_factory=dict)
    by_fp: dict[str, set[str]] = field(default_factory=dict)


@dataclass
class _Counter:
    staging_removed: int = 0
    expired_removed: int = 0
    quarantined: int = 0
    deleted_uninspectable: int = 0
    unsafe_unlinked: int = 0
    quarantine_evicted: int = 0
    inspected: int = 0

    def report(self) -> ReconcileReport:
        return ReconcileReport(**self.__dict__)


def _hash_fd(fd: int, expected_size: int) -> tuple[str, int]:
    """Stream-hash ``fd`` from its current offset to EOF in bounded chunks.

    Stops after ``expected_size + 1`` bytes, so a growing file cannot make this unbounded.
    """
    h = hashlib.sha256()
    total = 0
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    while total <= expected_size:
        want = min(CHUNK, expected_size + 1 - total)
        n = os.readv(fd, [view[:want]])
        if n == 0:
            break
        h.update(view[:n])
        total += n
    return h.hexdigest(), total


def _classify(names: Iterable[str]) -> tuple[list[str], list[str], list[str]]:
    ids: list[str] = []
    staging: list[str] = []
    others: list[str] = []
    for name in names:
        if name.startswith("st_") and STATE_ID_RE.fullmatch(name):
            ids.append(name)
        elif name.startswith(STAGING_PREFIX):
            staging.append(name)
        else:
            others.append(name)
    ids.sort()
    return ids, staging, others


def _dev_ino(st: os.stat_result) -> tuple[int, int]:
    return (st.st_dev, st.st_ino)


#: What a payload verification is remembered by: (st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns).
_PayloadKey = tuple[int, int, int, int, int]


def _payload_key(st: os.stat_result) -> _PayloadKey:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _os_error(exc: OSError) -> WerkError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return exhausted("runtime-state storage is full", retryable=True)
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        return forbidden()
    return internal("a runtime-state catalog operation failed")


class StateStore:
    """Durable, principal-scoped catalog of opaque runtime-state payloads.

    ``root`` is ``WERK_HOME/runtime-state/v1``. ``WERK_HOME`` itself may be a link the user
    chose; ``runtime-state`` and ``v1`` must be real directories (a link there makes reads
    empty and mutations fail with ``forbidden``). ``clock`` returns unix seconds and drives
    creation, access and expiry times. ``durable=False`` skips fsync (benchmarks only).
    ``audit_batch`` bounds how many already-validated states one reconciliation re-inspects
    (new, suspect and expired states are always handled).
    """

    def __init__(
        self,
        root: Path,
        *,
        max_payload_bytes: int = 8 << 30,
        clock: Callable[[], float] = time.time,
        quarantine_limit: int = 64,
        lock_timeout: float = 30.0,
        durable: bool = True,
        audit_batch: int = 32,
    ) -> None:
        self._root = Path(os.path.abspath(root))
        self._anchor = self._root.parent.parent
        self._root_names = (self._root.parent.name, self._root.name)
        if not all(self._root_names):
            raise ValueError("the store root needs two named parent levels below its anchor")
        self._max_payload = int(max_payload_bytes)
        self._clock = clock
        self._quarantine_limit = max(0, int(quarantine_limit))
        self._lock_timeout = float(lock_timeout)
        self._durable = durable
        self._audit_batch = max(1, int(audit_batch))
        self._rlock, self._flock = _locks_for(self._root)
        self._cache_lock = threading.Lock()
        self._listings: dict[str, _Listing] = {}
        self._meta_cache: dict[tuple[str, str], tuple[tuple[Any, ...], Metadata | None]] = {}
        self._la_cache: dict[tuple[str, str], tuple[_fs.Ident, int | None]] = {}
        self._fp_index: dict[str, _FpIndex] = {}
        self._suspects: dict[tuple[str, str], bool] = {}
        self._verified: OrderedDict[_PayloadKey, str] = OrderedDict()
        self._versions = itertools.count(1)
        # Mutation-side bookkeeping (only touched under the process mutex).
        self._known: dict[str, dict[str, int | None]] = {}
        self._known_version: dict[str, int] = {}
        self._audit_pos: dict[str, int] = {}

    @property
    def root(self) -> Path:
        return self._root

    # ------------------------------------------------------------------ helpers

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    def _fsync(self, fd: int) -> None:
        if self._durable:
            _fs.fsync_fd(fd)

    def _open_root(self, *, create: bool, strict: bool) -> int | None:
        """Descriptor of the root, walked from the anchor without following links.

        ``None`` when absent (and ``create`` is false) or, unless ``strict``, unsafe.
        """
        try:
            fd = os.open(self._anchor, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            if not create:
                return None
            os.makedirs(self._anchor, mode=_fs.DIR_MODE, exist_ok=True)
            fd = os.open(self._anchor, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except NotADirectoryError:
            if strict:
                raise forbidden() from None
            return None
        for name in self._root_names:
            try:
                try:
                    nfd = _fs.open_dir(name, fd)
                except FileNotFoundError:
                    if not create:
                        os.close(fd)
                        return None
                    with contextlib.suppress(FileExistsError):
                        _fs.make_private_dir(name, fd)
                    self._fsync(fd)
                    nfd = _fs.open_dir(name, fd)
            except OSError as exc:
                os.close(fd)
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    if strict:
                        raise forbidden() from None
                    return None
                raise
            os.close(fd)
            fd = nfd
        return fd

    def _same_root(self, rootfd: int) -> bool:
        """Whether the root path (which the lock file was opened through) still is ``rootfd``."""
        try:
            a = os.lstat(self._root)
        except OSError:
            return False
        b = os.fstat(rootfd)
        return stat.S_ISDIR(a.st_mode) and (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)

    @contextmanager
    def _mutating(self, *, create: bool, strict: bool = True, timeout: float | None = None) -> Iterator[int | None]:
        """Hold the process mutex and the catalog's advisory lock; yield the root descriptor."""
        with self._rlock:
            rootfd = self._open_root(create=create, strict=strict)
            if rootfd is None:
                yield None
                return
            try:
                lst = _fs.lstat_at(LOCK_NAME, rootfd)
                if lst is not None and not stat.S_ISREG(lst.st_mode):
                    _fs.remove_entry(LOCK_NAME, rootfd)  # a planted link or odd entry: never followed
                if create:
                    os.fchmod(rootfd, _fs.DIR_MODE)
                try:
                    self._flock.acquire(timeout=self._lock_timeout if timeout is None else timeout)
                except filelock.Timeout as exc:
                    raise unavailable("the runtime-state catalog is busy") from exc
                try:
                    if not self._same_root(rootfd):
                        raise forbidden()
                    yield rootfd
                finally:
                    self._flock.release()
            finally:
                os.close(rootfd)

    def _open_principal_ro(self, principal: str) -> int | None:
        rootfd = self._open_root(create=False, strict=False)
        if rootfd is None:
            return None
        try:
            return _fs.open_dir("p_" + principal, rootfd)
        except OSError:
            return None
        finally:
            os.close(rootfd)

    # ------------------------------------------------------------------ listing index

    def _rescan(self, principal: str, pfd: int, *, exact: bool) -> _Listing:
        before = os.fstat(pfd)
        t = _fs.now_ns()
        names = os.listdir(pfd)
        after = os.fstat(pfd)
        stable = _fs.ident(before) == _fs.ident(after)
        ids, staging, others = _classify(names)
        listing = _Listing(
            ident=_fs.ident(after),
            trusted=stable and (exact or not _fs.racy(after, t, RACY_MARGIN_NS)),
            ids=ids,
            id_set=frozenset(ids),
            staging=staging,
            others=others,
            version=next(self._versions),
        )
        with self._cache_lock:
            self._listings[principal] = listing
        return listing

    def _listing(self, principal: str, pfd: int, *, exact: bool = False) -> _Listing:
        """The principal's sorted ids, rescanned only when the directory changed.

        Under the catalog lock (``exact``) a fresh scan is exact; without it a scan of a
        directory changed within the racy margin is not trusted for reuse.
        """
        cur = _fs.ident(os.fstat(pfd))
        with self._cache_lock:
            cached = self._listings.get(principal)
        if cached is not None and cached.ident == cur and cached.trusted:
            return cached
        return self._rescan(principal, pfd, exact=exact)

    def _stamp(
        self,
        principal: str,
        pfd: int,
        before: _Listing,
        before_ident: _fs.Ident,
        *,
        add_id: str | None = None,
        add_staging: str | None = None,
        drop_staging: str | None = None,
    ) -> None:
        """After our own change under the lock: update the listing instead of rescanning.

        ``before`` must have been exact for ``before_ident`` (the directory's identity just
        before the change); otherwise the directory is rescanned.
        """
        if before_ident != before.ident:
            self._rescan(principal, pfd, exact=True)
            return
        ids, id_set = before.ids, before.id_set
        if add_id is not None:
            ids = list(ids)
            bisect.insort(ids, add_id)
            id_set = id_set | {add_id}
        staging = [n for n in before.staging if n != drop_staging]
        if add_staging is not None:
            staging.append(add_staging)
        listing = _Listing(
            ident=_fs.ident(os.fstat(pfd)),
            trusted=before.trusted,
            ids=ids,
            id_set=id_set,
            staging=staging,
            others=before.others,
            version=next(self._versions) if add_id is not None else before.version,
        )
        with self._cache_lock:
            self._listings[principal] = listing

    # ------------------------------------------------------------------ reading one state

    def _load_meta(self, sfd: int, principal: str, sid: str) -> Metadata | None:
        mst = _fs.lstat_at(META, sfd)
        cst = _fs.lstat_at(CHECKSUM, sfd)
        if mst is None or cst is None or not stat.S_ISREG(mst.st_mode) or not stat.S_ISREG(cst.st_mode):
            return None
        key = (principal, sid)
        cur: tuple[Any, ...] = (_fs.ident(mst), _fs.ident(cst))
        with self._cache_lock:
            cached = self._meta_cache.get(key)
        if cached is not None and cached[0] == cur:
            return cached[1]
        t = _fs.now_ns()
        got_meta = _fs.read_small(META, sfd, MAX_METADATA_BYTES)
        got_sum = _fs.read_small(CHECKSUM, sfd, 65)
        if got_meta is None or got_sum is None:
            return None
        meta = decode_metadata(got_meta[0], got_sum[0], expected_id=sid, expected_principal=principal)
        read_ident = (_fs.ident(got_meta[1]), _fs.ident(got_sum[1]))
        if (
            read_ident == cur
            and not _fs.racy(got_meta[1], t, RACY_MARGIN_NS)
            and not _fs.racy(got_sum[1], t, RACY_MARGIN_NS)
        ):
            with self._cache_lock:
                if len(self._meta_cache) >= _MAX_META_CACHE:
                    self._meta_cache.clear()
                self._meta_cache[key] = (cur, meta)
        return meta

    def _last_accessed(self, sfd: int, principal: str, sid: str) -> int | None:
        st = _fs.lstat_at(LAST_ACCESSED, sfd)
        if st is None or not stat.S_ISREG(st.st_mode):
            return None
        key = (principal, sid)
        cur = _fs.ident(st)
        with self._cache_lock:
            cached = self._la_cache.get(key)
        if cached is not None and cached[0] == cur:
            return cached[1]
        t = _fs.now_ns()
        got = _fs.read_small(LAST_ACCESSED, sfd, 32)
        value: int | None = None
        if got is not None:
            text = got[0].strip()
            if text.isdigit():
                value = int(text)
            if _fs.ident(got[1]) == cur and not _fs.racy(got[1], t, RACY_MARGIN_NS):
                with self._cache_lock:
                    if len(self._la_cache) >= _MAX_META_CACHE:
                        self._la_cache.clear()
                    self._la_cache[key] = (cur, value)
        return value

    def _look_in(self, sfd: int, principal: str, sid: str, now_ms: int) -> _Look:
        """Validate one state directory cheaply (stats + cached metadata; no payload hash)."""
        meta = self._load_meta(sfd, principal, sid)
        pin = _fs.lstat_at(PINNED, sfd)
        pinned = pin is not None and stat.S_ISREG(pin.st_mode)
        if meta is None:
            return _Look(_INVALID, pinned=pinned)
        pst = _fs.lstat_at(PAYLOAD, sfd)
        if pst is None or not stat.S_ISREG(pst.st_mode) or pst.st_size != meta.bytes:
            return _Look(_INVALID, meta=meta, pinned=pinned)
        if pin is not None and not pinned:
            return _Look(_INVALID, meta=meta)
        record = meta.record(pinned=pinned, last_accessed_unix_ms=self._last_accessed(sfd, principal, sid))
        kind = _EXPIRED if record.is_expired(now_ms) else _OK
        return _Look(kind, record=record, meta=meta, pinned=pinned, payload_ident=_fs.ident(pst))

    def _look(self, pfd: int, principal: str, sid: str, now_ms: int) -> _Look:
        """Read-only validation of ``sid``; deep suspects and malformed entries are invalid."""
        try:
            sfd = _fs.open_dir(sid, pfd)
        except OSError:
            return _Look(_ABSENT)  # absent, or a link / non-directory that is never followed
        try:
            look = self._look_in(sfd, principal, sid, now_ms)
        except OSError:
            look = _Look(_INVALID)
        finally:
            os.close(sfd)
        key = (principal, sid)
        with self._cache_lock:
            if look.kind == _INVALID:
                self._suspects.setdefault(key, False)
            elif self._suspects.get(key):
                look = _Look(_INVALID, meta=look.meta, pinned=look.pinned)
        return look

    def _mark_suspect(self, principal: str, sid: str, *, deep: bool) -> None:
        with self._cache_lock:
            self._suspects[(principal, sid)] = deep or self._suspects.get((principal, sid), False)

    # ------------------------------------------------------------------ reconciliation

    def _inspect(self, pfd: int, principal: str, sid: str, now_ms: int, *, deep: bool) -> _Look:
        """Thorough inspection under the lock: entry set, types, metadata, size, optional hash."""
        st = _fs.lstat_at(sid, pfd)
        if st is None:
            return _Look(_ABSENT)
        if not stat.S_ISDIR(st.st_mode):
            return _Look(_UNSAFE)
        try:
            sfd = _fs.open_dir(sid, pfd)
        except OSError:
            return _Look(_UNINSPECTABLE)
        try:
            names = os.listdir(sfd)
            if len(names) > MAX_STATE_ENTRIES:
                return _Look(_UNINSPECTABLE)
            malformed = False
            for name in names:
                est = _fs.lstat_at(name, sfd)
                if est is None:
                    continue
                if stat.S_ISDIR(est.st_mode):
                    return _Look(_UNINSPECTABLE)
                if name.startswith(TMP_PREFIX):
                    os.unlink(name, dir_fd=sfd)  # an interrupted access-time write
                    continue
                if name not in STATE_FILES or not stat.S_ISREG(est.st_mode):
                    malformed = True
            if malformed:
                return _Look(_INVALID)
            look = self._look_in(sfd, principal, sid, now_ms)
            if look.kind == _OK and deep:
                assert look.meta is not None
                fd = os.open(PAYLOAD, _fs.READ_FLAGS, dir_fd=sfd)
                try:
                    digest, size = _hash_fd(fd, look.meta.bytes)
                finally:
                    os.close(fd)
                if size != look.meta.bytes or not hmac.compare_digest(digest, look.meta.payload_sha256):
                    return _Look(_INVALID, meta=look.meta)
            return look
        except OSError:
            return _Look(_UNINSPECTABLE)
        finally:
            os.close(sfd)

    @staticmethod
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

    def _quarantine_fd(self, rootfd: int, c: _Counter) -> int:
        st = _fs.lstat_at(QUARANTINE, rootfd)
        if st is not None and not stat.S_ISDIR(st.st_mode):
            os.unlink(QUARANTINE, dir_fd=rootfd)
            c.unsafe_unlinked += 1
            st = None
        if st is None:
            _fs.make_private_dir(QUARANTINE, rootfd)
            self._fsync(rootfd)
        return _fs.open_dir(QUARANTINE, rootfd)

    def _quarantine(self, rootfd: int, pfd: int, principal: str, name: str, c: _Counter) -> None:
        """Move ``name`` into ``.quarantine`` (or delete it when retention is zero)."""
        if self._quarantine_limit == 0:
            _fs.remove_entry(name, pfd)
            c.quarantined += 1
            c.quarantine_evicted += 1
            self._fsync(pfd)
            return
        qfd = self._quarantine_fd(rootfd, c)
        try:
            qname = f"{self._now_ms():013d}-{secrets.token_hex(4)}-{principal[:8]}-{name}"[:200]
            os.rename(name, qname, src_dir_fd=pfd, dst_dir_fd=qfd)
            self._fsync(pfd)
            self._fsync(qfd)
        finally:
            os.close(qfd)
        c.quarantined += 1

    def _enforce_quarantine(self, rootfd: int, c: _Counter) -> None:
        st = _fs.lstat_at(QUARANTINE, rootfd)
        if st is None:
            return
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(QUARANTINE, dir_fd=rootfd)
            c.unsafe_unlinked += 1
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
                    c.unsafe_unlinked += 1
                    changed = True
                else:
                    dirs.append(name)
            # Conforming names start with a 13-digit timestamp; anything else sorts first.
            dirs.sort(key=lambda n: (n[:13].isdigit() and n[13:14] == "-", n))
            for name in dirs[: max(0, len(dirs) - self._quarantine_limit)]:
                _fs.remove_entry(name, qfd)
                c.quarantine_evicted += 1
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
            self._suspects.pop((principal, sid), None)
            self._meta_cache.pop((principal, sid), None)
            self._la_cache.pop((principal, sid), None)

    def _settle(self, rootfd: int, pfd: int, principal: str, sid: str, look: _Look, c: _Counter) -> bool:
        """Apply the outcome of an inspection; True when ``sid`` is a valid live state."""
        if look.kind == _OK:
            assert look.meta is not None
            self._known.setdefault(principal, {})[sid] = look.meta.expires_unix_ms
            with self._cache_lock:
                self._suspects.pop((principal, sid), None)
            return True
        if look.kind == _EXPIRED:
            self._remove_states(pfd, [sid])
            c.expired_removed += 1
        elif look.kind == _INVALID:
            self._quarantine(rootfd, pfd, principal, sid, c)
        elif look.kind == _UNINSPECTABLE:
            _fs.remove_entry(sid, pfd)
            self._fsync(pfd)
            c.deleted_uninspectable += 1
        elif look.kind == _UNSAFE:
            os.unlink(sid, dir_fd=pfd)
            self._fsync(pfd)
            c.unsafe_unlinked += 1
        self._forget(principal, sid)
        return False

    def _reconcile_principal(self, rootfd: int, principal: str, c: _Counter, now_ms: int, full: bool) -> None:
        try:
            pfd = _fs.open_dir("p_" + principal, rootfd)
        except OSError:
            return
        try:
            listing = self._listing(principal, pfd, exact=True)
            changed = False
            for name in listing.staging:
                if self._remove_abandoned(pfd, name):
                    c.staging_removed += 1
                    changed = True
            for name in listing.others:
                est = _fs.lstat_at(name, pfd)
                if est is None:
                    continue
                if stat.S_ISDIR(est.st_mode):
                    self._quarantine(rootfd, pfd, principal, name, c)
                else:
                    os.unlink(name, dir_fd=pfd)
                    c.unsafe_unlinked += 1
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
                    c.expired_removed += 1
                    self._forget(principal, sid)
                    changed = True
                    continue
                look = self._inspect(pfd, principal, sid, now_ms, deep=sid in deep_suspects)
                c.inspected += 1
                if not self._settle(rootfd, pfd, principal, sid, look, c) and look.kind != _ABSENT:
                    changed = True
            if changed:
                self._fsync(pfd)
                self._rescan(principal, pfd, exact=True)
                self._known_version[principal] = self._listings[principal].version
        finally:
            os.close(pfd)

    def _reconcile_locked(self, rootfd: int, *, full: bool = False) -> _Counter:
        c = _Counter()
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
                c.unsafe_unlinked += 1
                root_changed = True
                continue
            if name.startswith("p_") and PRINCIPAL_RE.fullmatch(name[2:]):
                self._reconcile_principal(rootfd, name[2:], c, now_ms, full)
        if root_changed:
            self._fsync(rootfd)
        self._enforce_quarantine(rootfd, c)
        return c

    def reconcile(self, *, full: bool = False) -> ReconcileReport:
        """Run the reconciliation every real mutation runs first (under both locks).

        Removes abandoned staging entries and expired states (TTL beats pinning),
        quarantines malformed or corrupt state directories (bounded retention), deletes
        entries that cannot be inspected safely and unlinks unsafe non-directory entries
        without following them. ``full`` re-inspects every state instead of a rotating
        ``audit_batch`` window. An absent root is left absent.
        """
        try:
            with self._mutating(create=False) as rootfd:
                if rootfd is None:
                    return ReconcileReport()
                return self._reconcile_locked(rootfd, full=full).report()
        except OSError as exc:
            raise _os_error(exc) from exc

    # ------------------------------------------------------------------ commit

    def _stream_payload(self, fd: int, payload: BinaryIO | Iterable[bytes | bytearray | memoryview]) -> tuple[int, str]:
        h = hashlib.sha256()
        total = 0

        def take(chunk: bytes | bytearray | memoryview) -> None:
            nonlocal total
            n = memoryview(chunk).nbytes
            if total + n > self._max_payload:
                raise exhausted("the state payload exceeds the configured size bound", retryable=False)
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
        envelope: dict[str, str],
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
        staging directory atomically to ``st_<random id>`` and fsyncs the parent. A
        mismatching ``expected_sha256`` is ``corrupt_state`` and publishes nothing. On any
        failure, or a crash at any point, nothing becomes visible.
        """
        validate_principal(principal)
        validate_name(model_id, "model_id")
        validate_name(backend, "backend")
        env = validate_envelope(envelope)
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
            id="st_" + "0" * 32,
            principal=principal,
            model_id=model_id,
            backend=backend,
            bytes=self._max_payload,
            payload_sha256="0" * 64,
            created_unix_ms=10**15,
            expires_unix_ms=10**15,
            envelope=env,
            prompt_fingerprint=prompt_fingerprint,
            prompt_tokens=prompt_tokens,
            adapter_meta=meta_extra,
        )
        if len(probe.encode()) > MAX_METADATA_BYTES:
            raise invalid("state metadata exceeds its size bound")
        try:
            pfd, sfd, staging, root_id = self._begin_commit(principal)
        except OSError as exc:
            raise _os_error(exc) from exc
        try:
            try:
                # Streaming runs without the catalog lock; the flock on the staging directory
                # marks it live, so no reconciliation (in any process) removes it meanwhile.
                pay = os.open(PAYLOAD, _fs.CREATE_FLAGS, _fs.FILE_MODE, dir_fd=sfd)
                try:
                    os.fchmod(pay, _fs.FILE_MODE)
                    size, digest = self._stream_payload(pay, payload)
                    if self._durable:
                        os.fsync(pay)
                finally:
                    os.close(pay)
                if expected_sha256 is not None and not hmac.compare_digest(digest, expected_sha256):
                    raise corrupt("the state payload does not match its expected SHA-256")
                with self._mutating(create=False) as rootfd:
                    if rootfd is None or _dev_ino(os.fstat(rootfd)) != root_id:
                        raise forbidden()
                    return self._publish_locked(
                        rootfd,
                        pfd,
                        sfd,
                        staging,
                        principal,
                        model_id=model_id,
                        backend=backend,
                        envelope=env,
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
            raise _os_error(exc) from exc

    def _begin_commit(self, principal: str) -> tuple[int, int, str, tuple[int, int]]:
        """Under the locks: reconcile, then create and flock a fresh staging directory.

        Returns (principal fd, staging fd holding ``LOCK_EX``, staging name, root dev/ino).
        """
        with self._mutating(create=True) as rootfd:
            assert rootfd is not None
            self._reconcile_locked(rootfd)
            pfd = self._principal_fd(rootfd, principal, create=True)
            assert pfd is not None
            try:
                staging = STAGING_PREFIX + secrets.token_hex(8)
                before = self._listing(principal, pfd, exact=True)
                before_ident = _fs.ident(os.fstat(pfd))
                _fs.make_private_dir(staging, pfd)
                self._stamp(principal, pfd, before, before_ident, add_staging=staging)
                sfd = _fs.open_dir(staging, pfd)
                fcntl.flock(sfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return pfd, sfd, staging, _dev_ino(os.fstat(rootfd))
            except BaseException:
                os.close(pfd)
                raise

    def _principal_fd(self, rootfd: int, principal: str, *, create: bool) -> int | None:
        name = "p_" + principal
        try:
            return _fs.open_dir(name, rootfd)
        except FileNotFoundError:
            if not create:
                return None
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            if not create:
                return None
            _fs.remove_entry(name, rootfd)  # a planted link: unlink it, never follow it
        _fs.make_private_dir(name, rootfd)
        self._fsync(rootfd)
        return _fs.open_dir(name, rootfd)

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
        envelope: dict[str, str],
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
        if pst is None or _dev_ino(pst) != _dev_ino(os.fstat(pfd)):
            raise forbidden("the principal directory changed during the commit")
        sst = _fs.lstat_at(staging, pfd)
        if sst is None or _dev_ino(sst) != _dev_ino(os.fstat(sfd)):
            raise internal("the staging entry vanished during the commit")
        now_ms = self._now_ms()
        sid = "st_" + secrets.token_hex(16)
        while _fs.lstat_at(sid, pfd) is not None:
            sid = "st_" + secrets.token_hex(16)
        meta = Metadata(
            id=sid,
            principal=principal,
            model_id=model_id,
            backend=backend,
            bytes=size,
            payload_sha256=digest,
            created_unix_ms=now_ms,
            expires_unix_ms=None if ttl_seconds is None else now_ms + ttl_seconds * 1000,
            envelope=envelope,
            prompt_fingerprint=prompt_fingerprint,
            prompt_tokens=prompt_tokens,
            adapter_meta=adapter_meta,
        )
        data = meta.encode()
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
        return meta.record(pinned=pinned, last_accessed_unix_ms=None)

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
            return look.record if look.kind == _OK else None
        except OSError:
            return None
        finally:
            os.close(pfd)

    def list(
        self,
        principal: str,
        *,
        model_id: str | None = None,
        tier: str | None = None,
        limit: int = MAX_PAGE,
        after: str | None = None,
    ) -> tuple[builtins.list[StateRecord], str | None]:
        """One read-only page ordered by id, strictly after ``after``.

        Returns the page and the id to pass as ``after`` for the next page (``None`` when
        no further visible state exists). Cost is proportional to the entries examined,
        not to the catalog: ids come from a cached per-principal index.
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
            return [], None
        pfd = self._open_principal_ro(principal)
        if pfd is None:
            return [], None
        out: builtins.list[StateRecord] = []
        try:
            listing = self._listing(principal, pfd)
            ids = listing.ids
            now_ms = self._now_ms()
            i = bisect.bisect_right(ids, after) if after is not None else 0
            while i < len(ids):
                look = self._look(pfd, principal, ids[i], now_ms)
                i += 1
                rec = look.record
                if look.kind != _OK or rec is None:
                    continue
                if model_id is not None and rec.model_id != model_id:
                    continue
                if len(out) == limit:
                    return out, out[-1].id
                out.append(rec)
            return out, None
        except OSError:
            return out, None
        finally:
            os.close(pfd)

    def find_by_fingerprint(self, principal: str, prompt_fingerprint: str) -> builtins.list[StateRecord]:
        """Read-only: this principal's valid, non-expired states with that fingerprint (by id)."""
        validate_principal(principal)
        if not isinstance(prompt_fingerprint, str) or not prompt_fingerprint:
            return []
        pfd = self._open_principal_ro(principal)
        if pfd is None:
            return []
        try:
            listing = self._listing(principal, pfd)
            with self._cache_lock:
                index = self._fp_index.get(principal)
            if index is None or index.version != listing.version:
                index = self._refresh_fp_index(principal, pfd, listing, index)
            now_ms = self._now_ms()
            out: builtins.list[StateRecord] = []
            for sid in sorted(index.by_fp.get(prompt_fingerprint, ())):
                look = self._look(pfd, principal, sid, now_ms)
                if (
                    look.kind == _OK
                    and look.record is not None
                    and look.record.prompt_fingerprint == prompt_fingerprint
                ):
                    out.append(look.record)
            return out
        except OSError:
            return []
        finally:
            os.close(pfd)

    def _refresh_fp_index(self, principal: str, pfd: int, listing: _Listing, old: _FpIndex | None) -> _FpIndex:
        index = _FpIndex(version=listing.version)
        if old is not None:
            for sid, fp in old.fp_of.items():
                if sid in listing.id_set:
                    index.fp_of[sid] = fp
                    if fp is not None:
                        index.by_fp.setdefault(fp, set()).add(sid)
        for sid in listing.ids:
            if sid in index.fp_of:
                continue
            try:
                sfd = _fs.open_dir(sid, pfd)
            except OSError:
                continue
            try:
                meta = self._load_meta(sfd, principal, sid)
            finally:
                os.close(sfd)
            if meta is None:
                continue  # not indexed; a later refresh looks again
            index.fp_of[sid] = meta.prompt_fingerprint
            if meta.prompt_fingerprint is not None:
                index.by_fp.setdefault(meta.prompt_fingerprint, set()).add(sid)
        with self._cache_lock:
            self._fp_index[principal] = index
        return index

    # ------------------------------------------------------------------ payload use

    def _open_verified(self, principal: str, state_id: str) -> tuple[StateRecord, int, int]:
        """Open and fully verify the payload; returns (record, fd at offset 0, state inode).

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
                if look.kind in (_ABSENT, _EXPIRED):
                    raise not_found()
                with self._cache_lock:
                    deep = self._suspects.get((principal, state_id), False)
                if look.kind != _OK or look.record is None or deep:
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
                    digest, size = _hash_fd(fd, st.st_size)
                    if size != rec.bytes or not hmac.compare_digest(digest, rec.payload_sha256):
                        self._mark_suspect(principal, state_id, deep=True)
                        raise corrupt()
                    os.lseek(fd, 0, os.SEEK_SET)
                    ok = True
                    return rec, fd, os.fstat(sfd).st_ino
                finally:
                    if not ok:
                        os.close(fd)
            finally:
                os.close(sfd)
        except OSError as exc:
            raise _os_error(exc) from exc
        finally:
            os.close(pfd)

    @contextmanager
    def open_payload(self, principal: str, state_id: str) -> Iterator[BinaryIO]:
        """Yield the payload for reading after verifying its size and SHA-256.

        Verification streams the file in bounded chunks before anything is yielded; a
        mismatch is ``corrupt_state`` (and the state is quarantined by the next mutation).
        Absent, expired or foreign ids are ``not_found``. When the block exits without an
        exception, ``last-accessed`` is recorded.
        """
        rec, fd, ino = self._open_verified(principal, state_id)
        f = os.fdopen(fd, "rb")
        try:
            yield f
        finally:
            f.close()
        self._record_access(principal, rec.id, ino)

    def copy_payload_to(self, principal: str, state_id: str, dest: int | str | os.PathLike[str]) -> StateRecord:
        """Copy the payload out while hashing it in the same pass; verify at the end.

        ``dest`` is an open writable descriptor (the caller discards it on error) or a new
        path (created 0600 exclusively, never through a link; removed on mismatch).
        Mismatch is ``corrupt_state``; success records ``last-accessed``.
        """
        validate_principal(principal)
        if not is_state_id(state_id):
            raise not_found()
        pfd = self._open_principal_ro(principal)
        if pfd is None:
            raise not_found()
        created: str | None = None
        out_fd: int | None = None
        try:
            try:
                sfd = _fs.open_dir(state_id, pfd)
            except OSError:
                raise not_found() from None
            try:
                look = self._look_in(sfd, principal, state_id, self._now_ms())
                if look.kind in (_ABSENT, _EXPIRED):
                    raise not_found()
                if look.kind != _OK or look.record is None:
                    self._mark_suspect(principal, state_id, deep=False)
                    raise corrupt()
                rec = look.record
                expected = look.meta.bytes if look.meta is not None else -1
                ino = os.fstat(sfd).st_ino
                fd = os.open(PAYLOAD, _fs.READ_FLAGS, dir_fd=sfd)
            finally:
                os.close(sfd)
            try:
                fcntl.flock(fd, fcntl.LOCK_SH)
                if isinstance(dest, int):
                    out_fd = dest
                else:
                    created = os.fspath(dest)
                    out_fd = os.open(created, _fs.CREATE_FLAGS, _fs.FILE_MODE)
                h = hashlib.sha256()
                total = 0
                view = memoryview(bytearray(CHUNK))
                while total <= expected:
                    n = os.readv(fd, [view[: min(CHUNK, expected + 1 - total)]])
                    if n == 0:
                        break
                    h.update(view[:n])
                    _fs.write_all(out_fd, view[:n])
                    total += n
                if total != expected or not hmac.compare_digest(h.hexdigest(), rec.payload_sha256):
                    self._mark_suspect(principal, state_id, deep=True)
                    raise corrupt()
                if created is not None and self._durable:
                    os.fsync(out_fd)
            finally:
                os.close(fd)
        except BaseException as exc:
            if created is not None and out_fd is not None:
                os.close(out_fd)
                out_fd = None
                with contextlib.suppress(OSError):
                    os.unlink(created)
            if isinstance(exc, OSError):
                raise _os_error(exc) from exc
            raise
        finally:
            os.close(pfd)
            if created is not None and out_fd is not None:
                os.close(out_fd)
        self._record_access(principal, rec.id, ino)
        return rec

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
            raise _os_error(exc) from exc
        finally:
            os.close(pfd)
        if not intact:
            self._mark_suspect(principal, state_id, deep=True)
            with (
                contextlib.suppress(OSError, WerkError),
                self._mutating(create=False, strict=False, timeout=min(self._lock_timeout, 5.0)) as rootfd,
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
            if look.kind in (_ABSENT, _EXPIRED):
                raise not_found()
            with self._cache_lock:
                deep = self._suspects.get((principal, sid), False)
            if look.kind != _OK or look.meta is None or deep:
                return False
            meta = look.meta
            try:
                fd = os.open(PAYLOAD, _fs.READ_FLAGS, dir_fd=sfd)
            except OSError:
                return False
        finally:
            os.close(sfd)
        try:
            before = os.fstat(fd)
            if not stat.S_ISREG(before.st_mode) or before.st_size != meta.bytes:
                return False
            key = _payload_key(before)
            with self._cache_lock:
                known = self._verified.get(key)
                if known is not None:
                    self._verified.move_to_end(key)
            if known is not None and hmac.compare_digest(known, meta.payload_sha256):
                return True
            t = _fs.now_ns()
            digest, size = _hash_fd(fd, meta.bytes)
            if size != meta.bytes or not hmac.compare_digest(digest, meta.payload_sha256):
                return False
            if _fs.ident(os.fstat(fd)) == _fs.ident(before) and not _fs.racy(before, t, RACY_MARGIN_NS):
                with self._cache_lock:
                    self._verified[key] = digest
                    self._verified.move_to_end(key)
                    while len(self._verified) > MAX_VERIFIED_CACHE:
                        self._verified.popitem(last=False)
            return True
        finally:
            os.close(fd)

    def _record_access(self, principal: str, sid: str, ino: int) -> None:
        """Best effort: write ``last-accessed`` atomically under the lock (no reconcile)."""
        try:
            with self._mutating(create=False, strict=False, timeout=min(self._lock_timeout, 5.0)) as rootfd:
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

    # ------------------------------------------------------------------ mutations

    def _target(self, rootfd: int, principal: str, state_id: str, c: _Counter) -> tuple[int, _Look] | None:
        """Inspect a mutation target after reconciliation; returns (principal fd, look) if live."""
        if not is_state_id(state_id):
            return None
        pfd = self._principal_fd(rootfd, principal, create=False)
        if pfd is None:
            return None
        try:
            look = self._inspect(pfd, principal, state_id, self._now_ms(), deep=False)
            if self._settle(rootfd, pfd, principal, state_id, look, c):
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
                c = self._reconcile_locked(rootfd)
                found = self._target(rootfd, principal, state_id, c)
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
            raise _os_error(exc) from exc

    def delete(self, principal: str, state_id: str) -> bool:
        """Delete one state (pinned or not); False when absent, expired, invalid or foreign."""
        validate_principal(principal)
        try:
            with self._mutating(create=False) as rootfd:
                if rootfd is None:
                    return False
                c = self._reconcile_locked(rootfd)
                found = self._target(rootfd, principal, state_id, c)
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
            raise _os_error(exc) from exc

    def _match(
        self,
        records: Iterable[StateRecord],
        *,
        model_id: str | None,
        tier: str | None,
        older_than_unix_ms: int | None,
        skip_pinned: bool,
        exclude: Collection[str],
    ) -> builtins.list[StateRecord]:
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

    def _visible(self, pfd: int, principal: str, ids: Iterable[str], *, locked: bool) -> builtins.list[StateRecord]:
        now_ms = self._now_ms()
        out = []
        for sid in ids:
            if locked:
                look = self._inspect(pfd, principal, sid, now_ms, deep=False)
            else:
                look = self._look(pfd, principal, sid, now_ms)
            if look.kind == _OK and look.record is not None:
                out.append(look.record)
        return out

    def prune(
        self,
        principal: str,
        *,
        ids: builtins.list[str] | None = None,
        model_id: str | None = None,
        tier: str | None = None,
        older_than_unix_ms: int | None = None,
        all: bool = False,
        dry_run: bool = True,
        skip_pinned: bool = False,
        exclude: Collection[str] = frozenset(),
    ) -> PruneOutcome:
        """Remove this principal's visible states chosen by exactly one selector.

        Selectors: ``ids`` (1..100 unique), a filter with at least one non-null restriction
        (``model_id``, ``tier``, ``older_than_unix_ms`` compared with creation time), or
        ``all=True`` (the caller checks the confirmation). ``dry_run`` (default) is
        read-only and reports ``removed == 0``. ``bytes`` is the logical size of the
        matched states (preview) or of the removed ones.
        """
        validate_principal(principal)
        has_filter = model_id is not None or tier is not None or older_than_unix_ms is not None
        if sum((ids is not None, has_filter, bool(all))) != 1:
            raise invalid("prune requires exactly one selector")
        if ids is not None and (
            not isinstance(ids, builtins.list)
            or not 1 <= len(ids) <= MAX_IDS_PER_OPERATION
            or len(set(ids)) != len(ids)
            or not all_str(ids)
        ):
            raise invalid("ids must be 1 through 100 unique state ids")
        if tier is not None and tier not in KNOWN_TIERS:
            raise invalid("unknown tier")
        if older_than_unix_ms is not None and (
            not isinstance(older_than_unix_ms, int) or isinstance(older_than_unix_ms, bool)
        ):
            raise invalid("older_than_unix_ms must be an integer")
        wanted: builtins.list[str] | None = None if ids is None else sorted(i for i in ids if is_state_id(i))
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
            raise _os_error(exc) from exc

    # ------------------------------------------------------------------ administration

    def _payload_in_use(self, sfd: int) -> bool:
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

    def _inventory_fd(self, rootfd: int) -> builtins.list[tuple[InventoryEntry, str | None]]:
        """Entries paired with their full principal (None for quarantine entries)."""
        now_ms = self._now_ms()
        out: builtins.list[tuple[InventoryEntry, str | None]] = []
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
                        live = self._staging_live(pfd, entry)
                        out.append((self._plain_entry("staging", entry, principal, pfd, active=live), principal))
                        continue
                    if not STATE_ID_RE.fullmatch(entry):
                        continue
                    try:
                        sfd = _fs.open_dir(entry, pfd)
                    except OSError:
                        continue
                    try:
                        look = self._look_in(sfd, principal, entry, now_ms)
                        active = self._payload_in_use(sfd)
                    except OSError:
                        look, active = _Look(_INVALID), False
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
                                bytes=meta.bytes if meta else None,
                                disk_bytes=_fs.tree_size(entry, pfd),
                                pinned=look.pinned,
                                active=active,
                                expired=look.kind == _EXPIRED,
                                invalid=look.kind not in (_OK, _EXPIRED),
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

    @staticmethod
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

    def inventory(self) -> builtins.list[InventoryEntry]:
        """Read-only inventory of every principal's states, quarantine and staging entries.

        ``active`` means a process holds the payload open for use (a shared ``flock`` taken
        by :meth:`open_payload`/:meth:`copy_payload_to`), or, for a staging entry, that a
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
        ids: builtins.list[str] | None = None,
        all: bool = False,
        dry_run: bool = False,
        active: Collection[str] = frozenset(),
    ) -> PurgeOutcome:
        """Administrative cleanup across principals (``werk cache purge``).

        Exactly one of ``ids`` (state ids or quarantine entry names) or ``all``. Pinned
        states and active ones (in ``active`` or with a payload in use) are skipped.
        ``all`` also clears the quarantine. A real run takes the same locks as the server
        and reconciles fully first; ``dry_run`` is read-only.
        """
        if (ids is not None and len(ids) > 0) == bool(all):
            raise invalid("purge requires either ids or all")
        wanted = frozenset(ids or ())
        keep_active = frozenset(active)

        Pair = tuple[InventoryEntry, str | None]

        def plan(entries: builtins.list[Pair]) -> tuple[builtins.list[Pair], builtins.list[InventoryEntry], int, int]:
            chosen: builtins.list[Pair] = []
            skipped: builtins.list[InventoryEntry] = []
            n_pinned = n_active = 0
            for e, principal in entries:
                if e.kind == "staging":
                    continue
                if not all and e.id not in wanted and _original(e) not in wanted:
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
            entries: builtins.list[Pair] = []
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
                extra: builtins.list[InventoryEntry] = []
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
            raise _os_error(exc) from exc


def _original(e: InventoryEntry) -> str:
    """A quarantine entry's original state directory name; other entries' own id."""
    return e.id.split("-", 3)[-1] if e.kind == "quarantine" else e.id


def all_str(values: Iterable[object]) -> bool:
    return all(isinstance(v, str) for v in values)


def runtime_state_root(werk_home: Path) -> Path:
    """``WERK_HOME/runtime-state/v1`` (nothing is created)."""
    return Path(werk_home) / "runtime-state" / "v1"

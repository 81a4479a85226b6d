"""Construction, root walk and locking: the primitives every layer of :class:`StateStore` uses.

Contract:

* Constructing a store creates nothing; :meth:`StoreBase._open_root` creates the two
  root levels only when asked to (a commit) and walks them from the anchor with no-follow
  calls: a link in place of ``runtime-state`` or ``v1`` makes reads see nothing and
  mutations fail with ``forbidden``.
* :meth:`StoreBase._mutating` is the only way to mutate: it holds the per-root process
  mutex and the ``.lock`` advisory lock (shared by every instance and process using the
  root) and checks that the locked path still is the opened root.
* The base owns every attribute the layers share (configuration, locks, caches and the
  mutation-side bookkeeping); each layer documents which of them it maintains.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import filelock

from werk_host.errors import unavailable

from . import _fs
from .layout import (
    LOCK_NAME,
    MAX_BYTES,
    MAX_STATES,
    PER_KEY_SHARE,
    FpIndex,
    Listing,
    Look,
    PayloadKey,
    Usage,
    forbidden,
)
from .records import Metadata
from .watch import Page

#: How long a mutation waits for the catalog lock before failing as ``unavailable``.
LOCK_TIMEOUT_S = 30.0
#: How long best-effort bookkeeping after a read (access time, quarantine) waits for it.
ACCESS_LOCK_TIMEOUT_S = 5.0

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


class StoreBase:
    """Configuration, shared state and the root/lock primitives (see :class:`StateStore`)."""

    def __init__(
        self,
        root: Path,
        *,
        max_payload_bytes: int = 8 << 30,
        clock: Callable[[], float] = time.time,
        quarantine_limit: int = 64,
        durable: bool = True,
        audit_batch: int = 32,
        max_states: int | None = None,
        max_bytes: int | None = None,
        max_states_per_key: int | None = None,
        max_bytes_per_key: int | None = None,
    ) -> None:
        self._root = Path(os.path.abspath(root))
        self._anchor = self._root.parent.parent
        self._root_names = (self._root.parent.name, self._root.name)
        if not all(self._root_names):
            raise ValueError("the store root needs two named parent levels below its anchor")
        self._max_payload = int(max_payload_bytes)
        self._clock = clock
        self._quarantine_limit = max(0, int(quarantine_limit))
        self._durable = durable
        self._audit_batch = max(1, int(audit_batch))
        # Storage bounds (quota.py): store-wide, and per principal (a share of the store-wide ones).
        self._max_states = MAX_STATES if max_states is None else int(max_states)
        self._max_bytes = MAX_BYTES if max_bytes is None else int(max_bytes)
        self._max_states_per_key = (
            max(1, self._max_states // PER_KEY_SHARE) if max_states_per_key is None else int(max_states_per_key)
        )
        self._max_bytes_per_key = (
            max(1, self._max_bytes // PER_KEY_SHARE) if max_bytes_per_key is None else int(max_bytes_per_key)
        )
        if min(self._max_states, self._max_bytes, self._max_states_per_key, self._max_bytes_per_key) < 1:
            raise ValueError("runtime-state storage bounds must be at least 1")
        self._rlock, self._flock = _locks_for(self._root)
        # Read-side caches (index.py, verify.py), shared by reader threads under this lock.
        self._cache_lock = threading.Lock()
        self._listings: dict[str, Listing] = {}
        self._meta_cache: dict[tuple[str, str], tuple[tuple[Any, ...], Metadata | None]] = {}
        self._la_cache: dict[tuple[str, str], tuple[_fs.Ident, int | None]] = {}
        self._look_cache: dict[tuple[str, str], tuple[_fs.Ident, Look, Look]] = {}
        self._fp_index: dict[str, FpIndex] = {}
        self._suspects: dict[tuple[str, str], bool] = {}
        self._suspects_changed = 0  # bumped on every change of ``_suspects`` (kept pages: watch.py)
        self._pages: dict[tuple[str, str | None, str | None, int, str | None], Page] = {}
        self._verified: OrderedDict[PayloadKey, str] = OrderedDict()
        self._versions = itertools.count(1)
        # Mutation-side bookkeeping (only touched under the process mutex).
        self._known: dict[str, dict[str, int | None]] = {}
        self._known_version: dict[str, int] = {}
        self._audit_pos: dict[str, int] = {}
        self._usage: dict[str, Usage] = {}

    @property
    def root(self) -> Path:
        """The catalog's directory (which may not exist yet)."""
        return self._root

    # ------------------------------------------------------------------ primitives

    def _unsuspect(self, key: tuple[str, str]) -> None:
        """Drop the suspect mark of ``key``, if any (caller holds ``_cache_lock``)."""
        if self._suspects.pop(key, None) is not None:
            self._suspects_changed += 1

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
                    self._flock.acquire(timeout=LOCK_TIMEOUT_S if timeout is None else timeout)
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

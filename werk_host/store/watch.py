"""Change notification for the catalog's directories (Linux inotify), so that a page of a state
listing can be reused while nothing it was read from changed (docs/operations.md, "State listings").

Contract:

* :meth:`Watcher.shared` is one watcher per process (``None`` where inotify is unavailable: not
  Linux, or the per-user instance limit is reached). A forked child gets its own.
* :meth:`Watcher.watch` adds a watch on an open directory descriptor under a caller's key and
  says whether the directory is watched. Watch a directory **before** reading it: a change made
  after the watch exists is always reported.
* :meth:`Watcher.epoch` drains the pending events (one non-blocking ``read``) and returns a count
  that changes whenever anything changed in a watched directory since the last call: an entry
  created, deleted, renamed in or out, a file written or closed after writing, attributes
  changed, the directory itself moved or deleted, or the kernel's event queue overflowed. Reads
  (opening, reading a payload) are not changes. A watch whose directory was moved or deleted is
  dropped, so its key is watched afresh when read again.
* Only changes made through this machine's kernel are reported (a network filesystem changed
  from another machine is not): callers reuse what they read for a bounded time only.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import itertools
import os
import struct
import sys
import termios
import threading
from collections.abc import Hashable
from dataclasses import dataclass
from typing import ClassVar, Final

from .records import StateRecord

_IN_MODIFY = 0x2
_IN_ATTRIB = 0x4
_IN_CLOSE_WRITE = 0x8
_IN_MOVED_FROM = 0x40
_IN_MOVED_TO = 0x80
_IN_CREATE = 0x100
_IN_DELETE = 0x200
_IN_DELETE_SELF = 0x400
_IN_MOVE_SELF = 0x800
_IN_IGNORED = 0x8000
_IN_ONLYDIR = 0x1000000
_MASK = (
    _IN_MODIFY
    | _IN_ATTRIB
    | _IN_CLOSE_WRITE
    | _IN_MOVED_FROM
    | _IN_MOVED_TO
    | _IN_CREATE
    | _IN_DELETE
    | _IN_DELETE_SELF
    | _IN_MOVE_SELF
    | _IN_ONLYDIR
)
_GONE = _IN_DELETE_SELF | _IN_MOVE_SELF | _IN_IGNORED
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len (then len bytes of name)
#: Bound on watches one process adds (each costs the kernel about 1 KiB); past it, nothing
#: more is watched and callers read as if no watcher existed.
MAX_WATCHES = 65_536


class Watcher:
    """inotify watches on catalog directories and a change count (module docstring)."""

    _shared: ClassVar[Watcher | None] = None
    _shared_pid: ClassVar[int] = 0
    _shared_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, libc: ctypes.CDLL, fd: int) -> None:
        self._libc = libc
        self._fd = fd
        self._lock = threading.Lock()
        self._epoch = 0
        self._draining = False  # a thread is between reading events and counting them
        self._keys: dict[Hashable, int] = {}
        self._by_wd: dict[int, Hashable] = {}

    @classmethod
    def shared(cls) -> Watcher | None:
        """This process's watcher, created on first use; ``None`` where inotify is unavailable."""
        pid = os.getpid()
        with cls._shared_lock:
            if cls._shared_pid != pid:
                cls._shared, cls._shared_pid = cls._create(), pid
            return cls._shared

    @staticmethod
    def _create() -> Watcher | None:
        if not sys.platform.startswith("linux"):
            return None
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            fd = int(libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC))
        except (OSError, AttributeError):
            return None
        return Watcher(libc, fd) if fd >= 0 else None

    def watch(self, key: Hashable, dir_fd: int) -> bool:
        """Watch the directory open as ``dir_fd`` under ``key`` (once); whether it is watched."""
        with self._lock:
            if key in self._keys:
                return True
            if len(self._keys) >= MAX_WATCHES:
                return False
            wd = int(self._libc.inotify_add_watch(self._fd, f"/proc/self/fd/{dir_fd}".encode(), _MASK))
            if wd < 0:
                return False
            stale = self._by_wd.get(wd)  # the kernel reuses a wd for an inode watched already
            if stale is not None and stale != key:
                self._keys.pop(stale, None)
            self._keys[key] = wd
            self._by_wd[wd] = key
            return True

    def epoch(self) -> int | None:
        """A count that differs from every earlier one after any change, or ``None`` when that
        cannot be told now (events are pending, or being counted by another thread): the caller
        then reads afresh and keeps nothing. Pending events are drained by one thread at a time.

        The common case (nothing pending) peeks at the queue's size (``FIONREAD``) without
        holding the lock: a thread waiting for the interpreter after a system call while holding
        it would queue every other request behind it. A drainer raises ``_draining`` before it
        reads, so a thread that finds the queue empty because a drainer just took the events
        sees either that flag or the count it then raised."""
        pending = struct.unpack("i", fcntl.ioctl(self._fd, termios.FIONREAD, b"\0\0\0\0"))[0]
        with self._lock:
            if self._draining:
                return None
            if not pending:
                return self._epoch
            self._draining = True
        data = b""
        try:
            while True:
                try:
                    data += os.read(self._fd, 64 * 1024)
                except BlockingIOError:
                    break
        finally:
            with self._lock:
                self._epoch += 1
                self._forget_gone(data)
                self._draining = False
        return None

    def _forget_gone(self, data: bytes) -> None:
        """Drop the keys of watches whose directory was moved or deleted (caller holds the lock)."""
        offset = 0
        while offset + _EVENT.size <= len(data):
            wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
            offset += _EVENT.size + length
            if mask & _GONE:
                key = self._by_wd.pop(wd, None)
                if key is not None:
                    self._keys.pop(key, None)
                    if not mask & _IN_IGNORED:
                        self._libc.inotify_rm_watch(self._fd, wd)


#: Serial numbers of page reads: each read of a page from disk gets the next one, and a page
#: reused from memory keeps its own, so an equal stamp means "nothing on the page changed"
#: (docs/operations.md, "State listings": the service keys what it builds from a page by it).
PAGE_STAMPS: Final = itertools.count(1)

#: How long a listed page is reused at most, whatever the watcher says (seconds).
PAGE_MAX_AGE_S = 1.0


@dataclass(frozen=True)
class Page:
    """One page of a listing as :meth:`werk_host.store.StateStore.list_states` returned it.

    Reused while the watcher's epoch and the store's suspect marks are unchanged, before the
    first expiry among the states it examined (``until_ms``), for at most :data:`PAGE_MAX_AGE_S`
    (``born``, monotonic). ``records`` is shared between callers: read-only."""

    epoch: int
    suspects: int
    until_ms: int | None
    born: float
    records: list[StateRecord]
    after: str | None
    #: this read of the page (:data:`PAGE_STAMPS`): equal only for the very same read
    stamp: int

    def reusable(self, epoch: int, suspects: int, now_ms: int, now: float) -> bool:
        return (
            epoch == self.epoch
            and suspects == self.suspects
            and (self.until_ms is None or now_ms < self.until_ms)
            and now - self.born < PAGE_MAX_AGE_S
        )

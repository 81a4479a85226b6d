"""Backend-owned cache directories under ``WERK_HOME/backends/<plugin>/<entry>/``
(and ``<plugin>/workers/<entry>/``: one entry per worker).

Convention for plugins: a live owner keeps an exclusive ``flock`` on ``<entry>/owner.lock``
for as long as the entry is in use (:func:`hold_owner_lock`). ``werk cache`` lists every
entry with its size and whether it is active, and purges only entries whose lock it can take
(a crashed owner's lock is released by the kernel). Nothing is followed through a link.
"""

from __future__ import annotations

import fcntl
import os
import stat
from pathlib import Path
from typing import NamedTuple

LOCK_NAME = "owner.lock"
#: A plugin directory of this name holds one cache entry per worker: ``<plugin>/workers/<id>/``.
WORKERS_DIR = "workers"


def remove_tree(path: Path, *, ignore_errors: bool = False) -> None:
    """``shutil.rmtree(path)``; :mod:`shutil` is imported only when a tree is removed, never on
    the way to a start's first spawn (docs/operations.md, "Start-up")."""
    import shutil

    shutil.rmtree(path, ignore_errors=ignore_errors)


def hold_owner_lock(entry: Path) -> int:
    """Mark ``entry`` active: returns an fd holding the exclusive lock (close it to release)."""
    fd = os.open(entry / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise
    return fd


class BackendCacheEntry(NamedTuple):
    id: str
    plugin: str
    bytes: int
    active: bool

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "kind": "backend_cache",
            "plugin": self.plugin,
            "bytes": self.bytes,
            "active": self.active,
        }


def _size(path: Path) -> int:
    total = 0
    for root, dirs, files in os.walk(path, followlinks=False):
        for name in files:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(root, d))]
    return total


def try_owner_lock(entry: Path) -> int | None:
    """An fd holding the entry's lock, or ``None`` when a live owner holds it (close the fd to release).

    A holder in this very process counts as live too: ``flock`` locks belong to open file descriptions.
    """
    try:
        fd = os.open(entry / LOCK_NAME, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        fd = os.open(entry, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def _entries(home: Path) -> list[tuple[str, Path]]:
    base = home / "backends"
    found: list[tuple[str, Path]] = []
    if not base.is_dir() or base.is_symlink():
        return found
    for plugin in sorted(os.listdir(base)):
        plugin_dir = base / plugin
        if plugin_dir.is_symlink() or not plugin_dir.is_dir():
            continue
        for name in sorted(os.listdir(plugin_dir)):
            entry = plugin_dir / name
            if entry.is_symlink() or not entry.is_dir():
                continue
            if name == WORKERS_DIR:  # one entry per worker (e.g. oMLX's backends/omlx/workers/<id>/)
                found += [(plugin, w) for w in sorted(entry.iterdir()) if not w.is_symlink() and w.is_dir()]
            else:
                found.append((plugin, entry))
    return found


def _cache_id(plugin: str, entry: Path) -> str:
    nested = entry.parent.name == WORKERS_DIR and entry.parent.parent.name == plugin
    return f"backend:{plugin}/{WORKERS_DIR}/{entry.name}" if nested else f"backend:{plugin}/{entry.name}"


def inventory(home: Path) -> list[BackendCacheEntry]:
    """Every backend cache entry with its size and activity (read-only)."""
    listed = []
    for plugin, entry in _entries(home):
        fd = try_owner_lock(entry)
        if fd is not None:
            os.close(fd)
        listed.append(BackendCacheEntry(_cache_id(plugin, entry), plugin, _size(entry), fd is None))
    return listed


def purge(home: Path, *, ids: list[str] | None, dry_run: bool) -> list[BackendCacheEntry]:
    """Remove the named (or, with ``ids=None``, all) inactive entries; returns what went."""
    removed = []
    for plugin, entry in _entries(home):
        cache_id = _cache_id(plugin, entry)
        if ids is not None and cache_id not in ids:
            continue
        fd = try_owner_lock(entry)
        if fd is None:
            continue  # a live owner holds it
        try:
            size = _size(entry)
            if not dry_run:
                remove_tree(entry)  # rmtree unlinks symlinks instead of following them
        finally:
            os.close(fd)
        removed.append(BackendCacheEntry(cache_id, plugin, size, False))
    return removed

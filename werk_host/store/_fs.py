"""Descriptor-relative, no-follow filesystem primitives for the runtime-state store.

Every path below the store root is reached with ``*at`` system calls relative to an
already opened directory descriptor, with ``O_NOFOLLOW`` (or ``follow_symlinks=False``)
on the final component. Intermediate components are never strings that the kernel could
resolve through a planted link, so nothing outside the opened tree is read, written or
deleted through one.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import stat
import time

#: Flags for opening a directory without following a link in its place.
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: Flags for reading a file; ``O_NONBLOCK`` keeps a planted FIFO from blocking the open.
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
#: Flags for creating a new private file (never an existing one, never through a link).
CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC

TMP_PREFIX = ".tmp-"
DIR_MODE = 0o700
FILE_MODE = 0o600

#: Identity of a file or directory as seen by ``stat``; a change means "look again".
Ident = tuple[int, int, int, int, int, int]


def ident(st: os.stat_result) -> Ident:
    """(dev, ino, mtime_ns, ctime_ns, size, nlink) of ``st``."""
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_nlink)


def racy(st: os.stat_result, observed_ns: int, margin_ns: int) -> bool:
    """Whether ``st`` changed so recently that a same-timestamp change could go unnoticed.

    A cache built from a read at ``observed_ns`` is trusted only when the entry's mtime and
    ctime are at least ``margin_ns`` older than the read (the "racy git" rule). Filesystems
    with whole-second timestamps get a two-second margin.
    """
    m = margin_ns
    if st.st_mtime_ns % 1_000_000_000 == 0 or st.st_ctime_ns % 1_000_000_000 == 0:
        m = max(m, 2_000_000_000)
    return st.st_mtime_ns > observed_ns - m or st.st_ctime_ns > observed_ns - m


def now_ns() -> int:
    return time.time_ns()


def open_dir(name: str, dir_fd: int | None) -> int:
    """Open directory ``name`` (relative to ``dir_fd``) without following a link.

    Raises ``OSError`` (``ELOOP``/``ENOTDIR`` for a link or a non-directory).
    """
    if dir_fd is None:
        return os.open(name, DIR_FLAGS)
    return os.open(name, DIR_FLAGS, dir_fd=dir_fd)


def lstat_at(name: str, dir_fd: int) -> os.stat_result | None:
    """``lstat`` relative to ``dir_fd``; ``None`` when absent."""
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        return None


def read_small(name: str, dir_fd: int, limit: int) -> tuple[bytes, os.stat_result] | None:
    """Read a regular file of at most ``limit`` bytes; ``None`` if absent, not regular or too big."""
    try:
        fd = os.open(name, READ_FLAGS, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            return None
        chunks: list[bytes] = []
        total = 0
        while True:
            chunk = os.read(fd, limit + 1 - total)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                return None
        return b"".join(chunks), st
    except OSError:
        return None
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    """Write every byte of ``data`` to ``fd`` (``os.write`` may be partial)."""
    view = memoryview(data).cast("B")
    while view:
        n = os.write(fd, view)
        view = view[n:]


def write_new_file(name: str, dir_fd: int, data: bytes, *, durable: bool) -> None:
    """Create ``name`` exclusively (0600, no-follow), write ``data`` and fsync it.

    On any failure after the create (``ENOSPC`` mid-write, a failed fsync) the new file is
    unlinked before the error propagates: nothing half-written is left behind.
    """
    fd = os.open(name, CREATE_FLAGS, FILE_MODE, dir_fd=dir_fd)
    try:
        try:
            os.fchmod(fd, FILE_MODE)
            write_all(fd, data)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=dir_fd)  # we created it exclusively: it is ours
        raise


def replace_file(name: str, dir_fd: int, data: bytes, *, durable: bool) -> None:
    """Atomically replace ``name`` with ``data`` via a private temporary and ``rename``.

    The rename replaces a planted link itself rather than writing through it. The temporary
    never outlives a failure (a full filesystem included): it is unlinked before the error
    propagates.
    """
    tmp = f"{TMP_PREFIX}{secrets.token_hex(6)}"
    write_new_file(tmp, dir_fd, data, durable=durable)
    try:
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise


def make_private_dir(name: str, dir_fd: int) -> None:
    """``mkdir`` with owner-only mode (independent of the umask); removed again if that fails."""
    os.mkdir(name, DIR_MODE, dir_fd=dir_fd)
    try:
        fd = open_dir(name, dir_fd)
        try:
            os.fchmod(fd, DIR_MODE)
        finally:
            os.close(fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.rmdir(name, dir_fd=dir_fd)
        raise


def fsync_fd(fd: int) -> None:
    """fsync a descriptor; directories on platforms that refuse it are tolerated."""
    try:
        os.fsync(fd)
    except OSError as exc:  # pragma: no cover - platform dependent
        if exc.errno not in (errno.EINVAL, errno.EBADF, errno.ENOTSUP):
            raise


def remove_entry(name: str, dir_fd: int) -> bool:
    """Remove ``name`` below ``dir_fd`` without following links.

    A directory is removed recursively with :func:`shutil.rmtree`'s descriptor-based
    walk (it never descends through a link); anything else is unlinked. Returns whether
    something was removed.
    """
    st = lstat_at(name, dir_fd)
    if st is None:
        return False
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(name, dir_fd=dir_fd)
    else:
        try:
            os.unlink(name, dir_fd=dir_fd)
        except FileNotFoundError:
            return False
    return True


def tree_size(name: str, dir_fd: int, *, max_entries: int = 64) -> int | None:
    """Sum of regular-file sizes directly inside directory ``name`` (no recursion, no links).

    ``None`` when the entry cannot be inspected within ``max_entries``.
    """
    try:
        fd = open_dir(name, dir_fd)
    except OSError:
        st = lstat_at(name, dir_fd)
        return None if st is None else int(st.st_size)
    try:
        names = os.listdir(fd)
        if len(names) > max_entries:
            return None
        total = 0
        for child in names:
            st = lstat_at(child, fd)
            if st is not None and stat.S_ISREG(st.st_mode):
                total += st.st_size
        return total
    except OSError:
        return None
    finally:
        os.close(fd)

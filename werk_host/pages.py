"""Read-only shared mappings of file ranges, their page residency, and populating them (Linux).

The page-level half of the model-file lifecycle (docs/operations.md, "Model file cache"):

* :class:`FileMapping` maps ``length`` bytes of an open descriptor from a page-aligned
  ``offset``, read-only and shared (``PROT_READ``, ``MAP_SHARED``), through libc's ``mmap``
  itself, so the address is known without exporting a Python buffer. A shared read-only mapping
  shares the file's page cache with every other process that maps it; it copies nothing.
* :meth:`FileMapping.resident` counts the bytes whose pages are in memory (``mincore``).
* :meth:`FileMapping.advise_random` turns readahead off for the mapping's faults.
* :meth:`FileMapping.populate` establishes readable page-table entries for a range with
  ``madvise(MADV_POPULATE_READ)`` (Linux 5.14); where the kernel refuses it (``EINVAL``) it says
  so and, when asked, falls back to reading one byte per page, which faults the same pages in.
* :func:`resident_bytes` is a whole file's resident bytes, as ``fincore`` prints them.

Nothing here locks pages in memory or changes another process's mappings. Every call is a
syscall through :mod:`ctypes`; errors are :class:`OSError` with the kernel's ``errno``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import mmap
import os
from pathlib import Path

__all__ = ["MADV_POPULATE_READ", "PAGE", "FileMapping", "populate_supported", "resident_bytes"]

#: The OS page size.
PAGE = mmap.PAGESIZE
#: ``madvise`` advice that prefaults readable page-table entries (Linux 5.14+, uapi value).
MADV_POPULATE_READ = 22
#: ``madvise`` advice: faults read only their own page, no readahead around it.
MADV_RANDOM = 1
_PROT_READ = 0x1
_MAP_SHARED = 0x01
_MAP_FAILED = ctypes.c_void_p(-1).value

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
_libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
_libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
_libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)

_populate_ok: bool | None = None


def _fail(what: str) -> OSError:
    code = ctypes.get_errno()
    return OSError(code, f"{what}: {os.strerror(code)}")


class FileMapping:
    """``length`` bytes of ``fd`` from ``offset`` (a multiple of :data:`PAGE`), mapped read-only
    and shared until :meth:`close`. The descriptor may be closed after mapping."""

    def __init__(self, fd: int, offset: int, length: int) -> None:
        if offset % PAGE or offset < 0 or length <= 0:
            raise ValueError("offset must be a non-negative multiple of the page size, length positive")
        address = _libc.mmap(None, length, _PROT_READ, _MAP_SHARED, fd, offset)
        if address is None or address == _MAP_FAILED:
            raise _fail("mmap")
        self.address: int | None = address
        self.offset = offset
        self.length = length

    def _at(self, start: int, length: int) -> tuple[int, int]:
        if self.address is None:
            raise ValueError("the mapping is closed")
        if start < 0 or length < 0 or start + length > self.length:
            raise ValueError("range outside the mapping")
        return self.address + start, length

    def resident(self, start: int = 0, length: int | None = None) -> int:
        """Bytes of ``[start, start + length)`` (page-aligned ``start``) whose pages are in memory."""
        address, length = self._at(start, self.length - start if length is None else length)
        pages = (length + PAGE - 1) // PAGE
        if not pages:
            return 0
        vec = (ctypes.c_ubyte * pages)()
        if _libc.mincore(ctypes.c_void_p(address), length, vec) != 0:
            raise _fail("mincore")
        full = sum(b & 1 for b in vec[: pages - 1]) * PAGE
        last = length - (pages - 1) * PAGE
        return full + (last if vec[pages - 1] & 1 else 0)

    def advise_random(self) -> None:
        """``MADV_RANDOM`` over the whole mapping: a fault reads its own page and no neighbours."""
        address, length = self._at(0, self.length)
        if _libc.madvise(ctypes.c_void_p(address), length, MADV_RANDOM) != 0:
            raise _fail("madvise(MADV_RANDOM)")

    def populate(self, start: int, length: int, *, fallback: bool = True) -> bool:
        """Prefault ``[start, start + length)`` readable; ``True`` when ``MADV_POPULATE_READ`` did
        it, ``False`` when the kernel lacks it (then, with ``fallback``, one byte per page was
        read instead). Other errors (an I/O error, ``EFAULT`` past the file's end) raise."""
        global _populate_ok
        address, length = self._at(start, length)
        if _populate_ok is not False:
            if _libc.madvise(ctypes.c_void_p(address), length, MADV_POPULATE_READ) == 0:
                _populate_ok = True
                return True
            code = ctypes.get_errno()
            if code != errno.EINVAL:
                raise OSError(code, f"madvise(MADV_POPULATE_READ): {os.strerror(code)}")
            _populate_ok = False
        if fallback:
            for page in range(address, address + length, PAGE):
                ctypes.c_ubyte.from_address(page).value  # noqa: B018 - the read faults the page in
        return False

    def close(self) -> None:
        """Unmap (idempotent)."""
        if self.address is not None:
            address, self.address = self.address, None
            if _libc.munmap(ctypes.c_void_p(address), self.length) != 0:
                raise _fail("munmap")

    def __enter__(self) -> FileMapping:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "address", None) is not None:
            self.close()


def populate_supported() -> bool | None:
    """Whether ``MADV_POPULATE_READ`` worked on this kernel (``None``: not tried yet)."""
    return _populate_ok


def resident_bytes(path: str | os.PathLike[str]) -> int:
    """The bytes of the file at ``path`` whose pages are in the page cache (0 for an empty file)."""
    fd = os.open(Path(path), os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return 0
        with FileMapping(fd, 0, size) as mapping:
            return mapping.resident()
    finally:
        os.close(fd)

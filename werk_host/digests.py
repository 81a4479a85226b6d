"""File digests: :func:`sha256_file`, and what a file says remembered by its status (docs/operations.md, "Start-up").

A model's identity needs the SHA-256 of each of its files (:mod:`werk_host.models`): about 70 ms
for SmolLM2-135M, seconds for a 7 GB GGUF, on every ``werk serve --model`` and ``werk run``
before the backend can be spawned. :func:`remembered_sha256` keeps each digest under the user
cache directory (``digests/v1.json``), keyed by the file's resolved path and its status: device,
inode, size, and modification and status-change times in nanoseconds. Any write to the file,
a replacement or a rename onto its path changes that status (the status-change time moves with
every change to the inode), and the file is hashed again: the trust git's index and ccache put in
a file's status.

:func:`remembered_by_status` is that one mechanism for anything else a file's bytes decide (a
plugin's reading of its executable, for one): ``compute(path)`` is remembered under the user
cache directory (``digests/<kind>-v1.json``) by the same key, and used while the status holds.

The cache never decides anything on its own: an unreadable, malformed or foreign entry is a miss,
and a cache that cannot be written leaves the value computed. It holds at most
:data:`MAX_ENTRIES` files per kind (the least recently recorded go first) and is replaced
atomically (a temporary file, then a rename), so concurrent hosts never read a torn file.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeGuard, TypeVar

from werk_host.paths import user_cache_dir

MAX_ENTRIES = 256
_CHUNK = 1 << 20
_LOCK = threading.Lock()


def sha256_file(path: str | os.PathLike[str], *, chunk_size: int = _CHUNK) -> str:
    """Hex SHA-256 of a file, streamed in ``chunk_size`` blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()


T = TypeVar("T")


def cache_file(kind: str = "sha256") -> Path:
    """Where the values of ``kind`` are remembered (a file's SHA-256: ``digests/v1.json``)."""
    return user_cache_dir() / "digests" / ("v1.json" if kind == "sha256" else f"{kind}-v1.json")


def file_status(path: Path) -> list[int]:
    """What identifies a file's content without reading it: device, inode, size, and modification
    and status-change times in nanoseconds (any change to the file changes one of them)."""
    st = os.stat(path)
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _read(file: Path) -> dict[str, dict[str, object]]:
    try:
        with open(file, encoding="utf-8") as handle:
            raw = json.load(handle)
    except (OSError, ValueError):
        return {}
    return raw if isinstance(raw, dict) else {}


def remembered_by_status(
    path: Path, kind: str, compute: Callable[[Path], T], valid: Callable[[object], TypeGuard[T]]
) -> T:
    """``compute(path)`` for the regular file ``path`` (resolved by the caller), a JSON value:
    the one remembered for ``kind`` while the file's status is unchanged and ``valid`` accepts
    it, else computed (and remembered when the status held still while it was computed).
    Whatever ``compute`` raises is raised, and nothing is remembered."""
    file = cache_file(kind)
    before = file_status(path)
    entry = _read(file).get(str(path))
    if isinstance(entry, dict) and entry.get("status") == before:
        value = entry.get("value")
        if valid(value):
            return value
    value = compute(path)
    if file_status(path) == before:  # not changed while it was read
        _remember(file, str(path), before, value)
    return value


def _is_sha256(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and len(value) == 64


def remembered_sha256(path: Path) -> str:
    """The hex SHA-256 of the regular file ``path`` (resolved by the caller), remembered by its
    status (:func:`remembered_by_status`)."""
    return remembered_by_status(path, "sha256", sha256_file, _is_sha256)


def _remember(file: Path, key: str, status: list[int], value: object) -> None:
    import tempfile  # this module is imported before a start's first spawn; tempfile is not (docs/operations.md)

    with _LOCK:
        try:
            file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            entries = _read(file)
            entries.pop(key, None)
            entries[key] = {"status": status, "value": value}
            kept = dict(list(entries.items())[-MAX_ENTRIES:])
            fd, tmp = tempfile.mkstemp(prefix=".v1.", dir=file.parent)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as handle:
                    json.dump(kept, handle, separators=(",", ":"))
                os.replace(tmp, file)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except (OSError, TypeError, ValueError):
            pass  # a cache that cannot be written (or a value JSON cannot hold): computed anyway

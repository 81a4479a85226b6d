"""File digests: :func:`sha256_file`, and model-file digests remembered by file status (docs/operations.md, "Start-up").

A model's identity needs the SHA-256 of each of its files (:mod:`werk_host.models`): about 70 ms
for SmolLM2-135M, seconds for a 7 GB GGUF, on every ``werk serve --model`` and ``werk run``
before the backend can be spawned. :func:`remembered_sha256` keeps each digest under the user
cache directory (``digests/v1.json``), keyed by the file's resolved path and its status: device,
inode, size, and modification and status-change times in nanoseconds. Any write to the file,
a replacement or a rename onto its path changes that status (the status-change time moves with
every change to the inode), and the file is hashed again: the trust git's index and ccache put in
a file's status.

The cache never decides anything on its own: an unreadable, malformed or foreign entry is a miss,
and a cache that cannot be written leaves the digest computed. It holds at most
:data:`MAX_ENTRIES` files (the least recently recorded go first) and is replaced atomically
(a temporary file, then a rename), so concurrent hosts never read a torn file.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path

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


def cache_file() -> Path:
    return user_cache_dir() / "digests" / "v1.json"


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


def remembered_sha256(path: Path) -> str:
    """The hex SHA-256 of the regular file ``path`` (resolved by the caller): remembered while
    its status is unchanged, else computed (and remembered when the status held still while it
    was read)."""
    file = cache_file()
    before = file_status(path)
    entry = _read(file).get(str(path))
    if isinstance(entry, dict) and entry.get("status") == before:
        digest = entry.get("sha256")
        if isinstance(digest, str) and len(digest) == 64:
            return digest
    digest = sha256_file(path)
    if file_status(path) == before:  # not changed while it was read
        _remember(file, str(path), before, digest)
    return digest


def _remember(file: Path, key: str, status: list[int], digest: str) -> None:
    import tempfile  # imported before the first spawn, which this never precedes (docs/operations.md)

    with _LOCK:
        try:
            file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            entries = _read(file)
            entries.pop(key, None)
            entries[key] = {"status": status, "sha256": digest}
            kept = dict(list(entries.items())[-MAX_ENTRIES:])
            fd, tmp = tempfile.mkstemp(prefix=".v1.", dir=file.parent)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as handle:
                    json.dump(kept, handle, separators=(",", ":"))
                os.replace(tmp, file)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError:
            pass  # a cache that cannot be written: the digest was computed anyway

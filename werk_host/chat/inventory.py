"""Chat sessions in ``werk cache list`` and ``werk cache purge`` (docs/chat.md, "Storage").

Each session under ``WERK_HOME/chat-sessions/`` is listed with its conversation archive
(``chat:<name>``) and its native snapshot (``chat:<name>/native``: snapshot, index and receipt)
as two separately sized parts. A session whose owner lock a running ``werk chat``/``run``
holds is *active* and is never touched. Purging:

* ``chat:<name>/native`` removes the native snapshot and its receipt; ``chat:<name>`` removes
  the whole session, archive included;
* ``--all`` removes the native snapshots of every inactive session and keeps the archives,
  unless ``include_sessions`` (``--include-chat-sessions``), which removes inactive sessions
  entirely.

Listing is read-only (it creates nothing, follows no link); a purge takes the owner lock first,
so a chat starting meanwhile either waits for nothing or finds the session gone.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from werk_host.backend_caches import try_owner_lock
from werk_host.chat.archive import (
    ARCHIVE_NAME,
    MAX_ARCHIVE_BYTES,
    NATIVE_DIR,
    SESSION_NAME_RE,
    Conversation,
    sessions_root,
)
from werk_host.chat.native import RECEIPT_NAME
from werk_host.errors import WerkError
from werk_host.store._fs import open_dir, read_small

PREFIX: Final = "chat:"
NATIVE_SUFFIX: Final = "/native"


@dataclass(frozen=True)
class ChatSessionEntry:
    name: str
    active: bool
    archive_bytes: int | None
    messages: int | None
    model: str | None
    native_bytes: int | None
    receipt: bool

    @property
    def disk_bytes(self) -> int:
        return (self.archive_bytes or 0) + (self.native_bytes or 0)

    def to_json(self) -> dict[str, object]:
        archive = None
        if self.archive_bytes is not None:
            archive = {
                "id": f"{PREFIX}{self.name}",
                "bytes": self.archive_bytes,
                "messages": self.messages,
                "model": self.model,
            }
        native = None
        if self.native_bytes is not None:
            native = {"id": f"{PREFIX}{self.name}{NATIVE_SUFFIX}", "bytes": self.native_bytes, "receipt": self.receipt}
        return {
            "id": f"{PREFIX}{self.name}",
            "kind": "chat_session",
            "session": self.name,
            "active": self.active,
            "archive": archive,
            "native_snapshot": native,
        }


def _regular_size(path: Path) -> int | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def _dir_size(path: Path) -> int | None:
    """Sum of the regular files directly in ``path`` (``None``: no such directory, or a link)."""
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            return None
        names = os.listdir(path)
    except OSError:
        return None
    return sum(_regular_size(path / name) or 0 for name in names)


def _sessions(home: Path) -> list[tuple[str, Path]]:
    root = sessions_root(home)
    try:
        if not stat.S_ISDIR(os.lstat(root).st_mode):
            return []
        names = sorted(os.listdir(root))
    except OSError:
        return []
    found = []
    for name in names:
        path = root / name
        try:
            is_dir = stat.S_ISDIR(os.lstat(path).st_mode)
        except OSError:
            continue
        if is_dir and SESSION_NAME_RE.fullmatch(name):
            found.append((name, path))
    return found


def _active(path: Path) -> bool:
    fd = try_owner_lock(path)
    if fd is None:
        return True
    os.close(fd)
    return False


def _describe(name: str, path: Path, active: bool) -> ChatSessionEntry:
    archive_bytes = _regular_size(path / ARCHIVE_NAME)
    messages = model = None
    if archive_bytes is not None:
        with contextlib.suppress(WerkError, OSError):
            fd = open_dir(str(path), None)
            try:
                found = read_small(ARCHIVE_NAME, fd, MAX_ARCHIVE_BYTES)
            finally:
                os.close(fd)
            if found is not None:
                conversation = Conversation.decode(found[0])
                messages, model = len(conversation.messages), conversation.model
    native = path / NATIVE_DIR
    native_bytes = _dir_size(native)
    if native_bytes == 0:
        native_bytes = None
    receipt = _regular_size(native / RECEIPT_NAME) is not None
    return ChatSessionEntry(name, active, archive_bytes, messages, model, native_bytes, receipt)


def inventory(home: Path) -> list[ChatSessionEntry]:
    """Every chat session with its parts' sizes and whether it is active (read-only)."""
    return [_describe(name, path, _active(path)) for name, path in _sessions(home)]


@dataclass(frozen=True)
class ChatPurge:
    removed: list[dict[str, object]]
    skipped_active: list[str]

    def to_json(self) -> dict[str, object]:
        return {"chat_sessions": self.removed, "chat_sessions_skipped_active": self.skipped_active}


def owns(cache_id: str) -> bool:
    """Whether ``cache_id`` names a chat-session entry (``chat:...``)."""
    return cache_id.startswith(PREFIX)


def purge(home: Path, *, cache_id: str | None, include_sessions: bool = False, dry_run: bool = False) -> ChatPurge:
    """Remove one entry (``cache_id``) or, with ``cache_id=None``, what ``--all`` removes (see
    the module docstring); returns what went (or would go) and the active sessions skipped."""
    removed: list[dict[str, object]] = []
    skipped: list[str] = []
    for name, path in _sessions(home):
        if cache_id is not None:
            if cache_id == f"{PREFIX}{name}":
                whole = True
            elif cache_id == f"{PREFIX}{name}{NATIVE_SUFFIX}":
                whole = False
            else:
                continue
        else:
            whole = include_sessions
        fd = try_owner_lock(path)
        if fd is None:
            skipped.append(f"{PREFIX}{name}")
            continue
        try:
            entry = _describe(name, path, active=False)
            if whole:
                gone: dict[str, object] = {"id": f"{PREFIX}{name}", "bytes": entry.disk_bytes, "part": "session"}
                if not dry_run:
                    shutil.rmtree(path)  # rmtree unlinks links instead of following them
            elif entry.native_bytes is not None:
                gone = {"id": f"{PREFIX}{name}{NATIVE_SUFFIX}", "bytes": entry.native_bytes, "part": "native_snapshot"}
                if not dry_run:
                    shutil.rmtree(path / NATIVE_DIR)
            else:
                continue
        finally:
            os.close(fd)
        removed.append(gone)
    return ChatPurge(removed, skipped)


__all__ = ["ChatPurge", "ChatSessionEntry", "inventory", "owns", "purge"]

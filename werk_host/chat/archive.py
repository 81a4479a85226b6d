"""The private conversation archive of a chat session (docs/chat.md, "Sessions").

A session lives in ``WERK_HOME/chat-sessions/<name>/`` (0700, owned by the current user)::

    owner.lock         held (flock) by the one process using the session
    conversation.json  the archive: model, messages (0600, replaced atomically, fsynced)
    native/            the backend's native snapshot and receipt (werk_host.chat.native)

The archive is backend-neutral: plain OpenAI chat messages, so a conversation saved with one
runtime continues with another serving the same model. It is bounded (:data:`MAX_ARCHIVE_BYTES`,
:data:`MAX_MESSAGES`); an archive that is missing, malformed, oversized, a link or not a regular
file is refused with a clear error, never half-read. ``werk cache`` sees an entry whose lock is
held as active and leaves it alone (:mod:`werk_host.chat.inventory`).
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from werk_host.backend_caches import LOCK_NAME, hold_owner_lock
from werk_host.errors import ErrorCode, WerkError, invalid
from werk_host.paths import ensure_private_dir
from werk_host.seam import JsonObject
from werk_host.store._fs import fsync_fd, open_dir, read_small, replace_file

#: The directory below ``WERK_HOME`` holding one directory per session.
SESSIONS_DIR: Final = "chat-sessions"
ARCHIVE_NAME: Final = "conversation.json"
NATIVE_DIR: Final = "native"
ARCHIVE_SCHEMA: Final = "werk-chat-archive/1"
#: Largest archive written or read; a longer conversation is refused, not truncated.
MAX_ARCHIVE_BYTES: Final = 8 << 20
MAX_MESSAGES: Final = 4096
SESSION_NAME_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
#: The session ``--persistence`` uses when no ``--session`` names one.
DEFAULT_SESSION: Final = "default"
ROLES: Final = frozenset({"system", "user", "assistant"})


def private_to_user(st: os.stat_result) -> bool:
    """Whether ``st`` is owned by the current user and grants nothing to group or others
    (always true where the platform has no user ids)."""
    return not hasattr(os, "geteuid") or (st.st_uid == os.geteuid() and not stat.S_IMODE(st.st_mode) & 0o077)


def check_session_name(name: str) -> str:
    """``name`` when it is a valid session name (letters, digits, ``.``, ``_``, ``-``; ≤ 64)."""
    if not SESSION_NAME_RE.fullmatch(name):
        raise invalid(f"invalid session name {name!r}: use 1-64 letters, digits, '.', '_' or '-'")
    return name


@dataclass(frozen=True)
class Message:
    role: str
    content: str

    def to_json(self) -> JsonObject:
        return {"role": self.role, "content": self.content}


@dataclass
class Conversation:
    """The messages of one conversation and the model they were exchanged with.

    ``model_sha256`` lists the SHA-256 of the model's files when they are known (local runs);
    a conversation continues with "the same model" when those agree, or, where either side does
    not know them (``--server``), when the model names agree.
    """

    model: str
    model_sha256: tuple[str, ...] = ()
    messages: list[Message] = field(default_factory=list)

    def same_model(self, model: str, sha256: tuple[str, ...]) -> bool:
        if self.model_sha256 and sha256:
            return sorted(self.model_sha256) == sorted(sha256)
        return self.model == model

    def encode(self) -> bytes:
        doc = {
            "schema": ARCHIVE_SCHEMA,
            "model": self.model,
            "model_sha256": list(self.model_sha256),
            "messages": [m.to_json() for m in self.messages],
        }
        return json.dumps(doc, ensure_ascii=False, indent=1).encode("utf-8") + b"\n"

    @classmethod
    def decode(cls, data: bytes) -> Conversation:
        """Parse an archive; raises ``corrupt_state`` for anything but a well-formed one."""
        try:
            doc = json.loads(data.decode("utf-8"))
            if not isinstance(doc, dict) or doc.get("schema") != ARCHIVE_SCHEMA:
                raise ValueError("not a Werk chat archive")
            model, digests, raw = doc["model"], doc["model_sha256"], doc["messages"]
            if not isinstance(model, str) or not isinstance(digests, list) or not isinstance(raw, list):
                raise ValueError("malformed header")
            if len(raw) > MAX_MESSAGES or not all(isinstance(d, str) for d in digests):
                raise ValueError("too many messages or malformed digests")
            messages = []
            for item in raw:
                if (
                    not isinstance(item, dict)
                    or item.get("role") not in ROLES
                    or not isinstance(item.get("content"), str)
                ):
                    raise ValueError("malformed message")
                messages.append(Message(item["role"], item["content"]))
        except (ValueError, KeyError, UnicodeDecodeError) as err:
            raise WerkError(ErrorCode.CORRUPT_STATE, f"the conversation archive is unreadable ({err})") from err
        return cls(model, tuple(digests), messages)


def sessions_root(home: Path) -> Path:
    return home / SESSIONS_DIR


class SessionDir:
    """An open session directory, held with its owner lock until :meth:`close`.

    Opening a session another process holds fails with ``resource_exhausted`` ("in use").
    """

    def __init__(self, home: Path, name: str) -> None:
        self.name = check_session_name(name)
        root = ensure_private_dir(sessions_root(home))
        self.path = ensure_private_dir(root / self.name)
        try:
            self._lock_fd: int | None = hold_owner_lock(self.path)
        except BlockingIOError as err:
            raise WerkError(
                ErrorCode.RESOURCE_EXHAUSTED, f"session {self.name} is in use by another werk chat or run"
            ) from err

    @property
    def native_dir(self) -> Path:
        """The backend snapshot directory (created private on first use)."""
        return ensure_private_dir(self.path / NATIVE_DIR)

    def exists(self) -> bool:
        """Whether the session has a saved conversation."""
        try:
            return stat.S_ISREG(os.lstat(self.path / ARCHIVE_NAME).st_mode)
        except FileNotFoundError:
            return False

    def load(self) -> Conversation | None:
        """The saved conversation, ``None`` when there is none yet; refuses an unsafe or bad file."""
        if not self.exists():
            if os.path.lexists(self.path / ARCHIVE_NAME):
                raise WerkError(ErrorCode.CORRUPT_STATE, "the conversation archive is not a regular file")
            return None
        fd = open_dir(str(self.path), None)
        try:
            found = read_small(ARCHIVE_NAME, fd, MAX_ARCHIVE_BYTES)
        finally:
            os.close(fd)
        if found is None:
            raise WerkError(
                ErrorCode.CORRUPT_STATE, f"the conversation archive is unreadable or over {MAX_ARCHIVE_BYTES} bytes"
            )
        data, st = found
        if not private_to_user(st):
            raise WerkError(ErrorCode.CORRUPT_STATE, "the conversation archive is not private to this user")
        return Conversation.decode(data)

    def save(self, conversation: Conversation) -> int:
        """Replace the archive atomically and durably (0600); returns its size in bytes.

        Raises ``resource_exhausted`` when the conversation is over the archive bounds (the old
        archive stays as it was)."""
        if len(conversation.messages) > MAX_MESSAGES:
            raise WerkError(ErrorCode.RESOURCE_EXHAUSTED, f"the conversation has over {MAX_MESSAGES} messages")
        data = conversation.encode()
        if len(data) > MAX_ARCHIVE_BYTES:
            raise WerkError(
                ErrorCode.RESOURCE_EXHAUSTED, f"the conversation archive would be over {MAX_ARCHIVE_BYTES} bytes"
            )
        fd = open_dir(str(self.path), None)
        try:
            replace_file(ARCHIVE_NAME, fd, data, durable=True)
            fsync_fd(fd)
        finally:
            os.close(fd)
        return len(data)

    def close(self) -> None:
        """Release the owner lock (idempotent)."""
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            os.close(fd)


__all__ = [
    "ARCHIVE_NAME",
    "DEFAULT_SESSION",
    "LOCK_NAME",
    "MAX_ARCHIVE_BYTES",
    "MAX_MESSAGES",
    "NATIVE_DIR",
    "SESSIONS_DIR",
    "Conversation",
    "Message",
    "SessionDir",
    "check_session_name",
    "private_to_user",
    "sessions_root",
]

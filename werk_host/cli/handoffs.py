"""Handoff files and JSON input files for ``werk runtime`` (docs/cli.md, "werk runtime").

Contracts: a handoff never reaches the terminal. :class:`SecretFile` creates a new owner-only
file (0600, ``O_EXCL|O_NOFOLLOW``; an existing path or a link is refused) and removes it again
when it is not used; :func:`replace_secret_file` atomically replaces a consumed handoff with the
next one; :func:`read_handoff_file` reads only an owner-only regular file that is not a link,
bounded at the protocol's handoff size. :func:`read_input_file` reads a JSON file (``-`` =
stdin) bounded at the protocol's 1 MiB request size and never echoes its contents. Failures are
:class:`~werk_host.cli.connection.HandoffFileError` (exit 15) or
:class:`~werk_host.cli.connection.InputError` (exit 14).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
import sys
from pathlib import Path
from typing import Any

from werk_host.cli.connection import HandoffFileError, InputError
from werk_host.protocol import MAX_HANDOFF_BYTES, MAX_REQUEST_BYTES

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def read_input_file(path: str, what: str) -> Any:
    """Read a JSON file (``-`` = stdin), bounded at the protocol's 1 MiB request size."""
    try:
        if path == "-":
            raw = sys.stdin.buffer.read(MAX_REQUEST_BYTES + 1)
        else:
            with open(path, "rb") as handle:
                raw = handle.read(MAX_REQUEST_BYTES + 1)
    except OSError as err:
        raise InputError(f"cannot read the {what}: {err.strerror or type(err).__name__}") from None
    if len(raw) > MAX_REQUEST_BYTES:
        raise InputError(f"the {what} exceeds {MAX_REQUEST_BYTES} bytes")
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise InputError(f"the {what} is not valid UTF-8 JSON") from None


class SecretFile:
    """A new owner-only file: created 0600 with O_EXCL|O_NOFOLLOW, removed again if unused."""

    def __init__(self, path: str) -> None:
        self.path = path
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
        try:
            self.fd: int | None = os.open(path, flags, 0o600)
        except FileExistsError:
            raise HandoffFileError(f"{path} already exists; refusing to overwrite a handoff file") from None
        except OSError as err:
            raise HandoffFileError(f"cannot create {path}: {err.strerror or type(err).__name__}") from None
        try:
            os.fchmod(self.fd, 0o600)
            info = os.fstat(self.fd)
        except OSError as err:
            self.discard()
            raise HandoffFileError(f"cannot secure {path}: {err.strerror or type(err).__name__}") from None
        self._identity = (info.st_dev, info.st_ino)

    def write(self, secret: str) -> None:
        assert self.fd is not None
        data = (secret + "\n").encode("utf-8")
        try:
            view = memoryview(data)
            while view:
                written = os.write(self.fd, view)
                view = view[written:]
            os.fsync(self.fd)
        except OSError as err:
            self.discard()
            raise HandoffFileError(
                f"cannot write {self.path}: {err.strerror or type(err).__name__}; the handoff is lost"
            ) from None
        os.close(self.fd)
        self.fd = None

    def discard(self) -> None:
        """Close and remove the file if it is still the one this object created."""
        if self.fd is None:
            return
        try:
            current = os.lstat(self.path)
            if (current.st_dev, current.st_ino) == self._identity:
                os.unlink(self.path)
        except OSError:
            pass
        finally:
            os.close(self.fd)
            self.fd = None


def replace_secret_file(path: str, secret: str) -> None:
    """Atomically replace ``path`` with a new owner-only file holding ``secret``."""
    target = Path(path)
    temp = str(target.with_name(f".{target.name}.{secrets.token_hex(8)}.tmp"))
    holder = SecretFile(temp)
    holder.write(secret)
    try:
        os.replace(temp, path)
    except OSError as err:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise HandoffFileError(
            f"cannot replace {path}: {err.strerror or type(err).__name__}; the next handoff is lost"
        ) from None


def read_handoff_file(path: str) -> str:
    """Read a handoff from an owner-only regular file that is not a symbolic link."""
    flags = os.O_RDONLY | _NOFOLLOW | _CLOEXEC | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError as err:
        raise HandoffFileError(f"cannot open {path}: {err.strerror or type(err).__name__}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise HandoffFileError(f"{path} is not a regular file")
        if hasattr(os, "getuid") and info.st_uid != os.getuid():
            raise HandoffFileError(f"{path} is not owned by the current user")
        if info.st_mode & 0o077:
            raise HandoffFileError(f"{path} is readable by others; it must be owner-only (chmod 600)")
        limit = MAX_HANDOFF_BYTES + 2
        raw = os.read(fd, limit + 1)
    except OSError as err:
        raise HandoffFileError(f"cannot read {path}: {err.strerror or type(err).__name__}") from None
    finally:
        os.close(fd)
    if len(raw) > limit:
        raise HandoffFileError(f"{path} is larger than a handoff can be")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise HandoffFileError(f"{path} is not UTF-8 text") from None
    if text.endswith("\r\n"):
        text = text[:-2]
    elif text.endswith("\n"):
        text = text[:-1]
    if not text:
        raise HandoffFileError(f"{path} is empty")
    return text


def handoff_note(path: str) -> str:
    return f"[secret handoff written to {path}; not shown]"

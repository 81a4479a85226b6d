"""Werk's llama.cpp snapshot format and how a verified payload reaches ``llama-server``.

Format (cache layout ``werk-llamacpp-slot-v3``, docs/states.md)::

    llama-server slot file (n_written bytes) | JSON header | u32 big-endian header length | MAGIC

The JSON header holds the exact prompt ``tokens``, the save acknowledgement (``n_saved``
tokens, ``n_written`` bytes) and ``tokens_hmac``, the keyed digest of the tokens
(:func:`.integrity.tokens_digest`). :func:`verify_tokens` requires the token ids at the head of
the slot file to equal ``tokens`` and the digest to be theirs under the adapter's key, before
any restore. The slot file comes first so that ``llama-server``
can restore the stored payload file itself: it reads exactly the ``n_written`` bytes its save
acknowledged and stops there. That is verified, never assumed: every restore must be
acknowledged with ``n_read == n_written`` and ``n_restored == n_saved``, and the functional
probe (:mod:`.probe`) restores a snapshot in this exact format, through :func:`presented`,
before a process generation may restore any state.

:func:`presented` hands ``llama-server`` the first ``n_written`` bytes of an open payload under
a fresh name in its private slot directory: a link to ``/proc/<werk pid>/fd/<fd>`` where the
platform has one (the already verified inode, whatever happens to its path meanwhile; no
copy), else a private copy of those bytes. :func:`acknowledged` and :func:`presented_entry` are
the checks a bare slot file (a ``werk chat`` session snapshot, a prompt-cache entry) passes on
its way there: the exact compatibility key, the save acknowledgement, the payload's size.
"""

from __future__ import annotations

import json
import os
import secrets
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from werk_host.plugin import ErrorCode, StoredStateRef, WerkError

from .integrity import slot_file_tokens, tokens_equal

__all__ = ["MAGIC", "MAX_HEADER_BYTES", "SlotImage", "presented", "read_image", "verify_tokens"]

MAGIC = b"\nWERKLCPP3\n"
MAX_HEADER_BYTES = 16 << 20
_LENGTH = struct.Struct(">I")
_TAIL = _LENGTH.size + len(MAGIC)
_COPY_CHUNK = 1 << 20


def _corrupt(message: str) -> WerkError:
    return WerkError(ErrorCode.CORRUPT_STATE, message)


@dataclass(frozen=True)
class SlotImage:
    """What a snapshot says about its slot file: the prompt tokens, the save acknowledgement and
    the tokens' keyed digest."""

    tokens: list[int]
    n_saved: int
    n_written: int
    tokens_hmac: str

    def trailer(self) -> bytes:
        """``JSON header | u32 length | MAGIC``, written after the slot file's bytes."""
        header = json.dumps(
            {
                "tokens": self.tokens,
                "n_saved": self.n_saved,
                "n_written": self.n_written,
                "tokens_hmac": self.tokens_hmac,
            },
            separators=(",", ":"),
        ).encode()
        return header + _LENGTH.pack(len(header)) + MAGIC

    def size(self) -> int:
        """The whole snapshot's size in bytes."""
        return self.n_written + len(self.trailer())


def read_image(fd: int, size: int) -> SlotImage:
    """Parse the trailer of the ``size``-byte snapshot open at ``fd`` (positional reads only).

    Raises ``corrupt_state`` when the trailer is missing or malformed, when the header's byte
    count does not add up to ``size`` or its token count differs from ``n_saved``.
    """
    if size < _TAIL:
        raise _corrupt("snapshot is not a llama.cpp Werk snapshot")
    tail = os.pread(fd, _TAIL, size - _TAIL)
    if len(tail) != _TAIL or tail[_LENGTH.size :] != MAGIC:
        raise _corrupt("snapshot is not a llama.cpp Werk snapshot")
    (length,) = _LENGTH.unpack(tail[: _LENGTH.size])
    if length > MAX_HEADER_BYTES or length > size - _TAIL:
        raise _corrupt("snapshot header length is out of bounds")
    raw = os.pread(fd, length, size - _TAIL - length)
    try:
        header = json.loads(raw)
        tokens = [int(t) for t in header["tokens"]]
        n_saved, n_written = int(header["n_saved"]), int(header["n_written"])
        digest = header["tokens_hmac"]
    except (ValueError, KeyError, TypeError) as err:
        raise _corrupt("snapshot header is malformed") from err
    if not isinstance(digest, str) or n_written + length + _TAIL != size or n_saved != len(tokens) or n_written <= 0:
        raise _corrupt("snapshot header does not match the snapshot")
    return SlotImage(tokens, n_saved, n_written, digest)


def verify_tokens(fd: int, image: SlotImage, key: bytes) -> None:
    """``corrupt_state`` unless the slot file open at ``fd`` holds exactly ``image.tokens`` and
    ``image.tokens_hmac`` is their digest under ``key``."""
    if slot_file_tokens(fd, image.n_written) != image.tokens:
        raise _corrupt("the slot file holds other tokens than the snapshot claims")
    if not tokens_equal(key, image.tokens, image.tokens_hmac):
        raise _corrupt("the snapshot's token digest does not verify")


def _fd_link(fd: int) -> str | None:
    """A path that reopens exactly the inode open at ``fd`` from another process, if any."""
    path = f"/proc/{os.getpid()}/fd/{fd}"
    return path if os.path.exists(path) else None


@contextmanager
def presented(slot_dir: Path, fd: int, n_bytes: int) -> Iterator[str]:
    """Yield a fresh file name in ``slot_dir`` whose first ``n_bytes`` are those of ``fd``.

    ``slot_dir`` is the process's private slot directory; the name is random and created
    exclusively (a link to the open descriptor, or a private copy of the bytes where no such
    link exists) and removed when the block exits.
    """
    name = f"werk-restore-{secrets.token_hex(16)}.bin"
    path = slot_dir / name
    target = _fd_link(fd)
    try:
        if target is not None:
            os.symlink(target, path)
        else:
            out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            try:
                offset = 0
                while offset < n_bytes:
                    chunk = os.pread(fd, min(_COPY_CHUNK, n_bytes - offset), offset)
                    if not chunk:
                        raise _corrupt("snapshot is shorter than its save acknowledgement")
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(out, view) :]
                    offset += len(chunk)
            finally:
                os.close(out)
        yield name
    finally:
        path.unlink(missing_ok=True)


def mismatch_fields(expected: dict[str, str], found: dict[str, str]) -> list[str]:
    """The compatibility key dimensions whose values differ (or exist on one side only)."""
    return sorted(k for k in set(expected) | set(found) if expected.get(k) != found.get(k))


def check_compatible(stored: StoredStateRef, expected: dict[str, str], what: str) -> None:
    """``incompatible_state``, with the ``mismatch_fields``, unless ``stored`` was written under
    exactly the compatibility key ``expected`` (``what`` names it in the error)."""
    if stored.compat_key != expected:
        raise WerkError(
            ErrorCode.INCOMPATIBLE_STATE,
            f"the {what} was saved under another llama-server configuration",
            details={"mismatch_fields": mismatch_fields(expected, stored.compat_key)},
        )


def acknowledged(stored: StoredStateRef, expected: dict[str, str], what: str) -> tuple[int, int]:
    """The save acknowledgement ``(n_saved, n_written)`` of a stored bare slot file (``what``
    names it in errors), once its compatibility key is ``expected`` exactly:
    ``incompatible_state`` with ``mismatch_fields`` when it was written under another
    configuration, ``corrupt_state`` when the acknowledgement is missing."""
    check_compatible(stored, expected, what)
    n_saved, n_written = stored.adapter_meta.get("n_saved"), stored.adapter_meta.get("n_written")
    if not isinstance(n_saved, int) or not isinstance(n_written, int) or n_saved <= 0 or n_written <= 0:
        raise _corrupt(f"the {what} lacks its save acknowledgement")
    return n_saved, n_written


@contextmanager
def presented_entry(stored: StoredStateRef, slot_dir: Path, n_written: int, what: str) -> Iterator[tuple[int, str]]:
    """The verified payload of a bare slot file open (its descriptor) and :func:`presented` in
    ``slot_dir`` (its name there); ``corrupt_state`` unless its size is ``n_written``."""
    with stored.open_payload() as payload:
        fd = payload.fileno()
        if os.fstat(fd).st_size != n_written:
            raise _corrupt(f"the {what}'s size is not its save acknowledgement")
        with presented(slot_dir, fd, n_written) as name:
            yield fd, name

"""On-disk layout of ``WERK_HOME/runtime-state/v1`` and the vocabulary the store's layers share.

Layout (exact)::

    runtime-state/v1/
    ├── .lock                       advisory lock (filelock) shared by every writer
    ├── .quarantine/                bounded: malformed or corrupt state directories
    └── p_<principal>/              opaque lowercase-hex principal (already an HMAC)
        └── st_<32 hex>/            random id, never derived from a prompt
            ├── metadata.json       canonical JSON, immutable after commit
            ├── metadata.sha256     hex SHA-256 of metadata.json
            ├── payload.bin         the adapter's opaque bytes
            ├── last-accessed       unix ms, written after a successful load
            └── pinned              present only when pinned

Contract: this module names those entries and the bounds the store enforces, and holds
the small pure helpers and value types that more than one layer uses (the verdict of
inspecting one state directory, the cached directory listings, payload hashing and the
mapping of ``OSError`` to protocol errors). It touches no file and keeps no state.
:data:`RACY_MARGIN_NS` and :func:`hash_fd` are read through this module at call time,
never copied by ``from ... import``.
"""

from __future__ import annotations

import enum
import errno
import hashlib
import os
from dataclasses import dataclass, field

from werk_host.errors import ErrorCode, WerkError, exhausted, internal

from . import _fs
from .records import Metadata, StateRecord

CHUNK = 1 << 20
LOCK_NAME = ".lock"
QUARANTINE = ".quarantine"
STAGING_PREFIX = ".staging-"
META = "metadata.json"
CHECKSUM = "metadata.sha256"
PAYLOAD = "payload.bin"
LAST_ACCESSED = "last-accessed"
PINNED = "pinned"
#: The durable verification receipt: the payload key and digest of a verified payload (verify.py).
VERIFIED = "verified"
STATE_FILES = frozenset({META, CHECKSUM, PAYLOAD, LAST_ACCESSED, PINNED, VERIFIED})
#: A state directory with more entries than this cannot be inspected safely: it is deleted.
MAX_STATE_ENTRIES = 16
#: Changes younger than this are not trusted to be visible in a directory's timestamps.
RACY_MARGIN_NS = 100_000_000
#: Store-wide bounds when none are configured (docs/states.md, "Quotas") ...
MAX_STATES = 4096
MAX_BYTES = 64 << 30
#: ... and the share of each that one principal may hold unless configured: a quarter, so
#: one key can never fill the store.
PER_KEY_SHARE = 4
#: Bytes ``metadata.sha256`` adds to a state's footprint (64 hex characters).
CHECKSUM_BYTES = 64


class Kind(enum.StrEnum):
    """Verdict of looking at one state directory."""

    OK = "ok"
    ABSENT = "absent"
    INVALID = "invalid"
    EXPIRED = "expired"
    UNSAFE = "unsafe"
    UNINSPECTABLE = "uninspectable"


@dataclass
class Look:
    """What a look at one state directory found (``record`` only for OK and EXPIRED)."""

    kind: Kind
    record: StateRecord | None = None
    meta: Metadata | None = None
    pinned: bool = False


@dataclass
class Listing:
    """Sorted state ids of one principal directory, valid for ``ident``."""

    ident: _fs.Ident
    trusted: bool
    ids: list[str]
    id_set: frozenset[str]
    staging: list[str]
    others: list[str]
    version: int


@dataclass
class FpIndex:
    """Prompt fingerprints of one principal's states, valid for the listing ``version``."""

    version: int
    fp_of: dict[str, str | None] = field(default_factory=dict)
    by_fp: dict[str, set[str]] = field(default_factory=dict)


@dataclass
class Usage:
    """What one principal's states occupy, valid for the listing ``version`` (quota.py).

    ``sizes`` maps each listed state id to its footprint; ``bytes`` is their sum.
    """

    version: int
    sizes: dict[str, int] = field(default_factory=dict)
    bytes: int = 0


#: What a payload verification is remembered by: (st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns).
PayloadKey = tuple[int, int, int, int, int]


def forbidden(message: str = "the runtime-state directory is unsafe") -> WerkError:
    return WerkError(ErrorCode.FORBIDDEN, message)


def os_error(exc: OSError) -> WerkError:
    """The protocol error for a failed catalog operation."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return exhausted("runtime-state storage is full", retryable=True)
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        return forbidden()
    return internal("a runtime-state catalog operation failed")


def hash_fd(fd: int, expected_size: int) -> tuple[str, int]:
    """Stream-hash ``fd`` from its current offset to EOF in bounded chunks.

    Stops after ``expected_size + 1`` bytes, so a growing file cannot make this unbounded.
    """
    h = hashlib.sha256()
    total = 0
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    while total <= expected_size:
        want = min(CHUNK, expected_size + 1 - total)
        n = os.readv(fd, [view[:want]])
        if n == 0:
            break
        h.update(view[:n])
        total += n
    return h.hexdigest(), total


def dev_ino(st: os.stat_result) -> tuple[int, int]:
    return (st.st_dev, st.st_ino)

"""Token integrity of llama.cpp slot files (docs/states.md, "Snapshot format of llama.cpp states").

A slot file written by ``POST /slots/<id>?action=save`` (llama.cpp's
``llama_state_seq_save_file``) begins with::

    u32 magic 'ggsq' | u32 version | u32 n_words | n_words × i32 | the sequence's KV data

(all little-endian). The ``n_words`` words are the slot's tokens as llama-server packed them:
either the plain token ids (older servers), or its packed token state, which begins with
``LLAMA_TOKEN_NULL`` (−1)::

    −1 | u32 state version (1) | u32 n | n × i32 token id | u32 media count (0) [| media chunks]

A text-only state has no media (Werk's state work is text only); anything else, a different
version or trailing words, is refused. The token ids are the ones the slot held when it was
saved, so they tell whose prompt the KV belongs to:

* :func:`slot_file_tokens` reads them (``corrupt_state`` when the header is not that, or the
  token count is out of the file's bounds);
* :func:`tokens_digest` is a keyed digest (HMAC-SHA-256) of a token list under the adapter's
  private key (:func:`load_key`), recorded in the snapshot's trailer and in the state's
  ``adapter_meta`` when a state is saved, and required again before any restore, so a state whose
  tokens were changed without the key is refused;
* :func:`key_id` names the key (a digest of it, never the key) in the compatibility key:
  a state written under another key is ``incompatible_state``, not quarantined.

The key is 32 random bytes in ``<work_dir>/state-tokens.key`` (mode 0600, created once,
exclusively; a file, so ``werk cache`` never treats it as a cache entry).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import struct
from pathlib import Path

from werk_host.plugin import ErrorCode, WerkError

__all__ = [
    "KEY_NAME",
    "SEQ_MAGIC",
    "key_id",
    "load_key",
    "path_tokens",
    "slot_file_tokens",
    "tokens_digest",
    "tokens_equal",
    "unpack_tokens",
]

#: ``LLAMA_STATE_SEQ_MAGIC`` ('ggsq').
SEQ_MAGIC = 0x67677371
KEY_NAME = "state-tokens.key"
_HEADER = struct.Struct("<III")
_TOKEN_NULL = -1  # LLAMA_TOKEN_NULL: the marker of llama-server's packed token state
_TOKENS_STATE_VERSION = 1
_DIGEST_DOMAIN = b"werk-llamacpp-slot-tokens-v1\0"
_KEY_BYTES = 32


def _corrupt(message: str) -> WerkError:
    return WerkError(ErrorCode.CORRUPT_STATE, message)


def slot_file_tokens(fd: int, n_written: int) -> list[int]:
    """The token ids at the start of the ``n_written``-byte slot file open at ``fd`` (positional reads)."""
    head = os.pread(fd, _HEADER.size, 0)
    if len(head) != _HEADER.size or n_written < _HEADER.size:
        raise _corrupt("the slot file is shorter than its header")
    magic, _version, count = _HEADER.unpack(head)
    if magic != SEQ_MAGIC:
        raise _corrupt("the slot file is not a llama.cpp sequence state")
    size = 4 * count
    if _HEADER.size + size > n_written:
        raise _corrupt("the slot file's token count is out of bounds")
    raw = b""
    while len(raw) < size:
        chunk = os.pread(fd, size - len(raw), _HEADER.size + len(raw))
        if not chunk:
            raise _corrupt("the slot file is shorter than its token count")
        raw += chunk
    return unpack_tokens(list(struct.unpack(f"<{count}i", raw)))


def unpack_tokens(words: list[int]) -> list[int]:
    """The token ids of llama-server's packed slot tokens ``words`` (see the module docstring)."""
    if not words or words[0] != _TOKEN_NULL:
        return words  # a plain token list
    if len(words) < 3 or words[1] != _TOKENS_STATE_VERSION or words[2] < 0:
        raise _corrupt("the slot file's token state has an unknown layout")
    n = words[2]
    if words[3 + n :] != [0]:
        raise _corrupt("the slot file's token state holds media or trailing data")
    return words[3 : 3 + n]


def path_tokens(path: Path, n_written: int) -> list[int]:
    """:func:`slot_file_tokens` of the file at ``path`` (not followed through a link)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        return slot_file_tokens(fd, n_written)
    finally:
        os.close(fd)


def tokens_digest(key: bytes, tokens: list[int]) -> str:
    """HMAC-SHA-256 (hex) of ``tokens`` as little-endian i32 under ``key``."""
    return hmac.new(key, _DIGEST_DOMAIN + struct.pack(f"<{len(tokens)}i", *tokens), hashlib.sha256).hexdigest()


def tokens_equal(key: bytes, tokens: list[int], digest: object) -> bool:
    """Whether ``digest`` is :func:`tokens_digest` of ``tokens`` (constant-time compare)."""
    return isinstance(digest, str) and hmac.compare_digest(tokens_digest(key, tokens), digest)


def key_id(key: bytes) -> str:
    """A public name of ``key`` for the compatibility key (reveals nothing of it)."""
    return hashlib.sha256(b"werk-llamacpp-token-key-id\0" + key).hexdigest()[:32]


def load_key(work_dir: Path) -> bytes:
    """The adapter's token key in ``work_dir``, created (exclusively, mode 0600) on first use."""
    work_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = work_dir / KEY_NAME
    if not path.exists():
        staging = work_dir / f".{KEY_NAME}.{secrets.token_hex(8)}"
        fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(secrets.token_bytes(_KEY_BYTES))
                out.flush()
                os.fsync(out.fileno())
            with contextlib.suppress(FileExistsError):  # exclusive: a concurrent creator's key wins
                os.link(staging, path)
        finally:
            staging.unlink(missing_ok=True)
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as source:
        key = source.read(_KEY_BYTES + 1)
    if len(key) != _KEY_BYTES:
        raise WerkError(ErrorCode.UNAVAILABLE, "the llama.cpp state key is damaged", retryable=False)
    return key

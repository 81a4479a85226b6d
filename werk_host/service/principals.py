"""API-key authentication and opaque principals.

An accepted key becomes ``Principal(id=HMAC-SHA-256(namespace_secret, key))``; the raw
key never leaves this module. The namespace secret lives at
``WERK_HOME/auth/runtime-namespace.key``: created atomically, owner-only, never served.

Operators (docs/deployments.md, "Residency"): a principal is an operator when its key is one of
the operator keys (``--operator-api-key-file``, ``WERK_OPERATOR_API_KEYS``), or when no key at
all is configured (the shared local principal: the local user runs the server). Operator keys
are accepted keys; a key given both ways is an operator's. Only operators change residency
(load, unload, pin, a ``keep_alive`` outside the profile's bounds).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from werk_host.paths import ensure_private_dir

_SECRET_BYTES = 32


@dataclass(frozen=True)
class Principal:
    """An authenticated caller. ``id`` is opaque lowercase hex; never the key itself.
    ``operator``: the caller may change residency (see the module docstring)."""

    id: str
    operator: bool = False

    def __repr__(self) -> str:
        return f"Principal({self.id[:8]}…{', operator' if self.operator else ''})"


def load_or_create_namespace_secret(home: Path) -> bytes:
    """Read the namespace secret, creating it atomically (0600, no-follow) when absent."""
    auth_dir = ensure_private_dir(home / "auth")
    path = auth_dir / "runtime-namespace.key"
    try:
        return _read_secret(path)
    except FileNotFoundError:
        pass
    tmp = auth_dir / f".runtime-namespace.key.{secrets.token_hex(8)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, secrets.token_bytes(_SECRET_BYTES))
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)  # atomic create-if-absent: a concurrent creator wins cleanly
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)
    dir_fd = os.open(auth_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return _read_secret(path)


def _read_secret(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        data = os.read(fd, _SECRET_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) != _SECRET_BYTES:
        raise RuntimeError("runtime namespace key is malformed; refusing to derive principals")
    return data


class Authenticator:
    """Checks presented keys in constant time and maps them to principals."""

    def __init__(self, api_keys: tuple[str, ...], namespace_secret: bytes, operator_keys: tuple[str, ...] = ()) -> None:
        operators = {k.encode() for k in operator_keys if k}
        keys = dict.fromkeys(k.encode() for k in (*api_keys, *operator_keys) if k)
        self._keys = tuple(keys)
        self._secret = namespace_secret
        # Derived once per configured key: a request pays the key comparisons, not an HMAC.
        self._principals = tuple(self._derive(key, key in operators) for key in self._keys)
        local_id = hmac.new(namespace_secret, b"local-principal", hashlib.sha256).hexdigest()
        self._local = Principal(local_id, operator=True)

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def authenticate(self, presented: str | None) -> Principal | None:
        """The principal for ``presented``, ``None`` when rejected; local when auth is off."""
        if not self._keys:
            return self._local
        if not presented:
            return None
        candidate = presented.encode()
        found: Principal | None = None
        for key, principal in zip(self._keys, self._principals, strict=True):  # every key: no early exit
            if hmac.compare_digest(candidate, key):
                found = principal
        return found

    def _derive(self, key: bytes, operator: bool) -> Principal:
        return Principal(hmac.new(self._secret, b"principal:" + key, hashlib.sha256).hexdigest(), operator)

    def prompt_fingerprint(self, principal: Principal, material: bytes) -> str:
        """A principal-keyed fingerprint: identical prompts of two principals never collide."""
        key = hmac.new(self._secret, b"prompt-key:" + principal.id.encode(), hashlib.sha256).digest()
        return hmac.new(key, material, hashlib.sha256).hexdigest()

    def __repr__(self) -> str:
        return f"Authenticator(<{len(self._keys)} keys>)"


def read_key_file(path: Path) -> list[str]:
    """One key per line; blank lines and ``#`` comments ignored."""
    return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.strip().startswith("#")]

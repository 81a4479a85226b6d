"""Value types of the runtime-state store and the on-disk metadata schema.

``metadata.json`` is canonical JSON (sorted keys, no whitespace) holding exactly the
keys in :data:`METADATA_KEYS`; ``metadata.sha256`` is the lowercase hex SHA-256 of those
bytes. Pinning and access time live in the ``pinned`` marker and the ``last-accessed``
file, so the integrity-checked metadata is immutable after commit.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from werk_host.errors import invalid

#: Value of the ``format`` key in every ``metadata.json`` this store writes.
METADATA_FORMAT = "werk.runtime-state.v1"
METADATA_KEYS = frozenset(
    {
        "format",
        "id",
        "principal",
        "model_id",
        "backend",
        "tier",
        "bytes",
        "payload_sha256",
        "created_unix_ms",
        "expires_unix_ms",
        "envelope",
        "prompt_fingerprint",
        "prompt_tokens",
        "adapter_meta",
    }
)

#: The only tier the disk store produces.
DISK_TIER = "disk"
#: Tiers a caller may filter on (the protocol's enum).
KNOWN_TIERS = frozenset({"vram", "ram", "disk", "external"})

STATE_ID_RE = re.compile(r"st_[0-9a-f]{32}")
PRINCIPAL_RE = re.compile(r"[0-9a-f]{1,128}")
SHA256_RE = re.compile(r"[0-9a-f]{64}")

MAX_METADATA_BYTES = 64 * 1024
MAX_ADAPTER_META_BYTES = 16 * 1024
MAX_COMPAT_KEY_ENTRIES = 64
MAX_COMPAT_KEY_KEY = 128
MAX_COMPAT_KEY_VALUE = 1024
MAX_NAME = 256
MAX_FINGERPRINT = 256
MAX_TTL_SECONDS = 2_592_000


@dataclass(frozen=True)
class StateRecord:
    """One committed, validated, non-corrupt state as the store sees it.

    ``tier`` is always ``"disk"``. ``compat_key``, ``prompt_fingerprint`` and
    ``adapter_meta`` are internal: the service must not put them in public summaries.
    ``compat_key`` and ``adapter_meta`` are per-record shallow copies; treat nested values
    as read-only.
    """

    id: str
    principal: str
    model_id: str
    backend: str
    tier: str
    bytes: int | None
    created_unix_ms: int
    last_accessed_unix_ms: int
    expires_unix_ms: int | None
    pinned: bool
    payload_sha256: str
    compat_key: dict[str, str] = field(default_factory=dict)
    prompt_fingerprint: str | None = None
    prompt_tokens: int | None = None
    adapter_meta: dict[str, Any] = field(default_factory=dict)

    def is_expired(self, now_ms: int) -> bool:
        """TTL is the stronger boundary: expired regardless of pinning."""
        return self.expires_unix_ms is not None and now_ms >= self.expires_unix_ms


@dataclass(frozen=True)
class PruneOutcome:
    """Result of :meth:`StateStore.prune`; a preview has ``removed == 0``."""

    matched: int
    removed: int
    bytes: int | None
    dry_run: bool = True


@dataclass(frozen=True)
class InventoryEntry:
    """One storage entry for ``werk cache list``; ``kind`` is state, quarantine or staging.

    ``principal_prefix`` is the first 8 hex characters of the opaque principal only.
    ``bytes`` is the logical payload size (None when unknown); ``disk_bytes`` what the
    entry's files occupy (None when it cannot be inspected safely).
    """

    kind: str
    id: str
    principal_prefix: str | None
    model_id: str | None
    backend: str | None
    bytes: int | None
    disk_bytes: int | None
    pinned: bool
    active: bool
    expired: bool
    invalid: bool
    created_unix_ms: int | None
    last_accessed_unix_ms: int | None
    expires_unix_ms: int | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class PurgeOutcome:
    """Result of :meth:`StateStore.purge` (the CLI's ``werk cache purge``)."""

    matched: int
    removed: int
    skipped_pinned: int
    skipped_active: int
    bytes: int
    dry_run: bool
    ids: list[str]
    skipped_ids: list[str]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Metadata:
    """Parsed, validated ``metadata.json`` (immutable after commit).

    ``state_id`` and ``size`` are stored under the keys ``id`` and ``bytes``.
    """

    state_id: str
    principal: str
    model_id: str
    backend: str
    size: int
    payload_sha256: str
    created_unix_ms: int
    expires_unix_ms: int | None
    compat_key: dict[str, str]
    prompt_fingerprint: str | None
    prompt_tokens: int | None
    adapter_meta: dict[str, Any]

    def encode(self) -> bytes:
        doc = {
            "format": METADATA_FORMAT,
            "id": self.state_id,
            "principal": self.principal,
            "model_id": self.model_id,
            "backend": self.backend,
            "tier": DISK_TIER,
            "bytes": self.size,
            "payload_sha256": self.payload_sha256,
            "created_unix_ms": self.created_unix_ms,
            "expires_unix_ms": self.expires_unix_ms,
            "envelope": self.compat_key,
            "prompt_fingerprint": self.prompt_fingerprint,
            "prompt_tokens": self.prompt_tokens,
            "adapter_meta": self.adapter_meta,
        }
        return json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False).encode("ascii")

    def record(self, *, pinned: bool, last_accessed_unix_ms: int | None) -> StateRecord:
        return StateRecord(
            id=self.state_id,
            principal=self.principal,
            model_id=self.model_id,
            backend=self.backend,
            tier=DISK_TIER,
            bytes=self.size,
            created_unix_ms=self.created_unix_ms,
            last_accessed_unix_ms=max(self.created_unix_ms, last_accessed_unix_ms or 0),
            expires_unix_ms=self.expires_unix_ms,
            pinned=pinned,
            payload_sha256=self.payload_sha256,
            compat_key=dict(self.compat_key),
            prompt_fingerprint=self.prompt_fingerprint,
            prompt_tokens=self.prompt_tokens,
            adapter_meta=dict(self.adapter_meta),
        )


def checksum_text(data: bytes) -> bytes:
    """Content of ``metadata.sha256`` for metadata bytes ``data``."""
    return hashlib.sha256(data).hexdigest().encode("ascii")


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def decode_metadata(data: bytes, checksum: bytes, *, expected_id: str, expected_principal: str) -> Metadata | None:
    """Parse and validate metadata; ``None`` for anything malformed or tampered with."""
    text = checksum[:-1] if checksum.endswith(b"\n") else checksum
    if not hmac.compare_digest(text, checksum_text(data)):
        return None
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(doc, dict) or set(doc) != METADATA_KEYS:
        return None
    try:
        if doc["format"] != METADATA_FORMAT or doc["tier"] != DISK_TIER:
            return None
        if doc["id"] != expected_id or doc["principal"] != expected_principal:
            return None
        for key in ("model_id", "backend"):
            v = doc[key]
            if not isinstance(v, str) or not 0 < len(v) <= MAX_NAME:
                return None
        if not _is_int(doc["bytes"]) or doc["bytes"] < 0:
            return None
        sha = doc["payload_sha256"]
        if not isinstance(sha, str) or not SHA256_RE.fullmatch(sha):
            return None
        if not _is_int(doc["created_unix_ms"]) or doc["created_unix_ms"] < 0:
            return None
        exp = doc["expires_unix_ms"]
        if exp is not None and not _is_int(exp):
            return None
        validate_compat_key(doc["envelope"])
        fp = doc["prompt_fingerprint"]
        if fp is not None and (not isinstance(fp, str) or len(fp) > MAX_FINGERPRINT):
            return None
        tokens = doc["prompt_tokens"]
        if tokens is not None and (not _is_int(tokens) or tokens < 0):
            return None
        meta = doc["adapter_meta"]
        if not isinstance(meta, dict):
            return None
    except Exception:  # any validation failure means "malformed"
        return None
    return Metadata(
        state_id=doc["id"],
        principal=doc["principal"],
        model_id=doc["model_id"],
        backend=doc["backend"],
        size=doc["bytes"],
        payload_sha256=sha,
        created_unix_ms=doc["created_unix_ms"],
        expires_unix_ms=exp,
        compat_key=dict(doc["envelope"]),
        prompt_fingerprint=fp,
        prompt_tokens=tokens,
        adapter_meta=meta,
    )


def validate_principal(principal: object) -> str:
    """The principal must be an opaque lowercase-hex string (already an HMAC)."""
    if not isinstance(principal, str) or not PRINCIPAL_RE.fullmatch(principal):
        raise invalid("principal must be an opaque lowercase hex string")
    return principal


def is_state_id(value: object) -> bool:
    return isinstance(value, str) and STATE_ID_RE.fullmatch(value) is not None


def validate_compat_key(compat_key: object) -> dict[str, str]:
    """A compatibility key is a small mapping of string dimensions to string values."""
    if not isinstance(compat_key, dict) or len(compat_key) > MAX_COMPAT_KEY_ENTRIES:
        raise invalid("envelope must be a mapping of at most 64 string entries")
    for k, v in compat_key.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise invalid("envelope keys and values must be strings")
        if not 0 < len(k) <= MAX_COMPAT_KEY_KEY or len(v) > MAX_COMPAT_KEY_VALUE:
            raise invalid("envelope entry out of bounds")
    return dict(compat_key)


def validate_adapter_meta(meta: object) -> dict[str, Any]:
    """Adapter metadata must be a JSON object of bounded encoded size."""
    if meta is None:
        return {}
    if not isinstance(meta, dict):
        raise invalid("adapter_meta must be a JSON object")
    try:
        encoded = json.dumps(meta, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise invalid("adapter_meta must be JSON-serialisable") from exc
    if len(encoded.encode("utf-8")) > MAX_ADAPTER_META_BYTES:
        raise invalid("adapter_meta exceeds its size bound")
    loaded = json.loads(encoded)
    assert isinstance(loaded, dict)
    return loaded


def validate_name(value: object, what: str) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_NAME:
        raise invalid(f"{what} must be a non-empty string of at most {MAX_NAME} characters")
    return value

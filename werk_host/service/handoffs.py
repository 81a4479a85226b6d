"""The in-memory prefill→decode handoff registry.

A handoff is a 256-bit random bearer secret; only its SHA-256 is stored. Each record is
bound to a principal and the exact adapter/process identity and expires after 15 minutes.
At most 128 live handoffs per principal and 1024 in total, counting reserved slots;
expired records are purged before the bounds are checked, and a full registry rejects
issuance with retryable ``resource_exhausted`` instead of evicting a live handoff.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from werk_host.errors import ErrorCode, WerkError

HANDOFF_TTL_SECONDS = 15 * 60
MAX_PER_PRINCIPAL = 128
MAX_TOTAL = 1024


@dataclass
class HandoffRecord:
    """What a handoff redeems. ``handle`` is a live backend handle (opaque) or ``None``."""

    principal_id: str
    adapter_identity: str
    model_id: str
    state_id: str | None
    handle: Any = None
    expires_at: float = 0.0
    lease_key: str | None = None

    def __repr__(self) -> str:
        return f"HandoffRecord(model_id={self.model_id!r}, state_id={self.state_id!r})"


@dataclass
class HandoffReservation:
    """A slot held in the registry; turned into a live handoff by ``issue`` or given back."""

    principal_id: str
    registry: HandoffRegistry = field(repr=False)
    active: bool = True

    def rollback(self) -> None:
        self.registry._release(self)


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


class HandoffRegistry:
    def __init__(
        self,
        *,
        ttl_seconds: float = HANDOFF_TTL_SECONDS,
        max_per_principal: int = MAX_PER_PRINCIPAL,
        max_total: int = MAX_TOTAL,
        clock: Callable[[], float] = time.monotonic,
        on_expire: Callable[[HandoffRecord], None] | None = None,
    ) -> None:
        self._ttl = ttl_seconds
        self._max_principal = max_per_principal
        self._max_total = max_total
        self._clock = clock
        self._on_expire = on_expire
        self._lock = threading.Lock()
        self._live: dict[str, HandoffRecord] = {}
        self._reserved: dict[str, int] = {}

    # -- accounting ----------------------------------------------------------------------
    def _purge_expired(self) -> list[HandoffRecord]:
        now = self._clock()
        gone = [key for key, rec in self._live.items() if rec.expires_at <= now]
        return [self._live.pop(key) for key in gone]

    def _count(self, principal_id: str) -> tuple[int, int]:
        mine = sum(1 for rec in self._live.values() if rec.principal_id == principal_id)
        mine += self._reserved.get(principal_id, 0)
        total = len(self._live) + sum(self._reserved.values())
        return mine, total

    def _reserve_locked(self, principal_id: str) -> HandoffReservation:
        mine, total = self._count(principal_id)
        if mine >= self._max_principal or total >= self._max_total:
            raise WerkError(
                ErrorCode.RESOURCE_EXHAUSTED, "too many live handoffs; decode or wait for expiry", retryable=True
            )
        self._reserved[principal_id] = self._reserved.get(principal_id, 0) + 1
        return HandoffReservation(principal_id, self)

    def _release(self, reservation: HandoffReservation) -> None:
        with self._lock:
            self._release_locked(reservation)

    def _release_locked(self, reservation: HandoffReservation) -> None:
        if not reservation.active:
            return
        reservation.active = False
        left = self._reserved.get(reservation.principal_id, 0) - 1
        if left > 0:
            self._reserved[reservation.principal_id] = left
        else:
            self._reserved.pop(reservation.principal_id, None)

    def _notify(self, expired: list[HandoffRecord]) -> None:
        if self._on_expire is not None:
            for record in expired:
                self._on_expire(record)

    # -- public API ----------------------------------------------------------------------
    def reserve(self, principal_id: str) -> HandoffReservation:
        """Hold a slot before any backend or persistence work (``resource_exhausted`` if full)."""
        with self._lock:
            expired = self._purge_expired()
            try:
                return self._reserve_locked(principal_id)
            finally:
                self._notify(expired)

    def issue(self, reservation: HandoffReservation, record: HandoffRecord) -> str:
        """Turn ``reservation`` into a live handoff for ``record``; returns the secret once."""
        if record.principal_id != reservation.principal_id:
            raise ValueError("reservation and record principals differ")
        secret = "wh_" + secrets.token_urlsafe(32)
        with self._lock:
            if not reservation.active:
                raise RuntimeError("reservation already used or rolled back")
            self._release_locked(reservation)
            record.expires_at = self._clock() + self._ttl
            self._live[_digest(secret)] = record
        return secret

    def consume(
        self, principal_id: str, secret: str, adapter_identity: str
    ) -> tuple[HandoffRecord, HandoffReservation]:
        """Redeem ``secret`` once and atomically hold a slot for a replacement handoff.

        Invalid, expired, consumed, foreign or other-process handoffs are ``expired_handoff``;
        a foreign principal's attempt leaves the handoff usable by its owner.
        """
        key = _digest(secret)
        with self._lock:
            expired = self._purge_expired()
            try:
                record = self._live.get(key)
                if record is None or record.principal_id != principal_id:
                    raise WerkError(ErrorCode.EXPIRED_HANDOFF, "handoff is invalid, expired or already used")
                del self._live[key]
                if record.adapter_identity != adapter_identity:
                    expired.append(record)
                    raise WerkError(ErrorCode.EXPIRED_HANDOFF, "handoff belongs to a backend process that is gone")
                self._reserved[principal_id] = self._reserved.get(principal_id, 0) + 1
                return record, HandoffReservation(principal_id, self)
            finally:
                self._notify(expired)

    def counts(self, principal_id: str | None = None) -> tuple[int, int]:
        """(live + reserved for ``principal_id``, live + reserved in total)."""
        with self._lock:
            expired = self._purge_expired()
            counts = self._count(principal_id or "")
        self._notify(expired)
        return counts

    def live_for(self, adapter_identity: str) -> int:
        """Live handoffs bound to one adapter identity (an instance's process generation): what
        residency never unloads (docs/deployments.md, "Eviction order")."""
        with self._lock:
            expired = self._purge_expired()
            live = sum(1 for r in self._live.values() if r.adapter_identity == adapter_identity)
        self._notify(expired)
        return live

    def expire_for(self, adapter_identity: str) -> int:
        """Expire every live handoff bound to ``adapter_identity`` (its instance was unloaded
        past ``handoff_wait``, docs/deployments.md, "Eviction order"): a later decode answers
        ``expired_handoff``; returns how many expired."""
        with self._lock:
            expired = self._purge_expired()
            gone = [key for key, rec in self._live.items() if rec.adapter_identity == adapter_identity]
            dropped = [self._live.pop(key) for key in gone]
        self._notify(expired + dropped)
        return len(dropped)

    def live_count(self) -> int:
        """Live (issued, unexpired, unredeemed) handoffs in total; reserved slots not included."""
        with self._lock:
            expired = self._purge_expired()
            live = len(self._live)
        self._notify(expired)
        return live

"""Memory reservations around backend work, held for the life of a state lease.

When the active adapter answers ``werk_memory_requirement`` with a positive byte count,
the service reserves it (host tier) *before* calling the backend, commits the accounting
only when the returned state's size agrees (``0 < bytes <= reserved``), and releases the
allocation when the lease ends: the handoff is consumed or expires (ephemeral state), or
the named state is evicted or pruned. Adapters that cannot bound their memory use take no
part, and ``runtime.memory.reservations`` stays ``unavailable`` for them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from werk_host.errors import WerkError
from werk_host.hooks import BackendHooks
from werk_host.memory import Allocation, MemoryManager, MemoryReservation, MemoryTier
from werk_host.seam import Adapter, MemoryOperation

log = logging.getLogger(__name__)


def positive_requirement(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


class MemoryLeases:
    def __init__(self, memory: MemoryManager, hooks: BackendHooks) -> None:
        self.memory = memory
        self.hooks = hooks
        self._leases: dict[str, tuple[Allocation, Callable[[], None]]] = {}
        self._owners: dict[str, str] = {}
        self._lock = threading.Lock()

    def requirement(self, adapter: Adapter, operation: MemoryOperation, model_id: str) -> int | None:
        return positive_requirement(self.hooks.memory_requirement(adapter, operation, model_id))

    def reserve(self, adapter: Adapter, operation: MemoryOperation, model_id: str) -> MemoryReservation | None:
        """Reserve the adapter's bound for ``operation`` before it runs (``None``: no bound)."""
        nbytes = self.requirement(adapter, operation, model_id)
        if nbytes is None:
            return None
        return self.memory.reserve(MemoryTier.HOST, nbytes)

    def commit(
        self,
        reservation: MemoryReservation | None,
        actual: int | None,
        key: str,
        release: Callable[[], None],
        *,
        owner: str = "",
    ) -> None:
        """Account the returned state under ``key``; raises ``internal`` when it disagrees."""
        if reservation is None:
            return
        allocation = reservation.commit(actual)
        with self._lock:
            self._leases[key] = (allocation, release)
            self._owners[key] = owner

    def rekey(self, old: str, new: str) -> str:
        """Move a lease to a new key (a handle's lease becomes its named state's); returns ``new``."""
        with self._lock:
            if old in self._leases:
                self._leases[new] = self._leases.pop(old)
                self._owners[new] = self._owners.pop(old)
        return new

    def keys_for(self, owner: str) -> list[str]:
        with self._lock:
            return [key for key, who in self._owners.items() if who == owner]

    def release(self, key: str) -> None:
        """End the lease of ``key`` (idempotent). A failed backend release stays accounted."""
        with self._lock:
            lease = self._leases.pop(key, None)
            self._owners.pop(key, None)
        if lease is None:
            return
        allocation, backend_release = lease
        try:
            self.memory.release(allocation, backend_release)
        except WerkError:
            log.error("backend release of a managed allocation failed; its bytes stay accounted")

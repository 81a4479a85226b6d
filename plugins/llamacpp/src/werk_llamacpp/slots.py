"""Slot routing of ordinary ``/v1`` traffic on a managed ``llama-server`` (docs/architecture.md,
"llama.cpp slot use").

Contract:

* **The state slot is Werk's.** The last slot (``LlamaCppAdapter.state_slot``) holds named
  states: probe, prefill → save, restore → decode and ``werk chat`` session snapshots run there
  under the adapter's ``slot_lock``. Ordinary traffic never reaches it while that work runs:
  every relayed request names its slot in ``id_slot``, chosen here; whatever slot the client
  named (``id_slot``, or the older spelling ``slot_id``) is dropped (:func:`strip_slot_fields`).
* **One request, one slot.** With n ≥ 2 slots a request holds one free ordinary slot
  (0 … n−2) exclusively from before it is sent until its response is closed: on the end of the
  body, on an error and on a client disconnect (the host closes every relayed response). With
  n = 1 there is no ordinary slot: an ordinary request holds ``slot_lock`` for its response's
  life instead (serialized with state work) and the adapter forgets which state the slot held.
* **Bounded waits.** Waiting for a slot (or, with n = 1, for ``slot_lock``) lasts at most
  ``slot_wait_s``; then a retryable ``unavailable``.
* **Capacity.** :func:`ordinary_capacity` (n − 1, or 1 when n = 1) is the instance's
  ``ChatLimits.max_concurrent_requests``.
* **A dead child is restarted, once.** When sending fails because the child died (the
  connection was refused, reset or closed before any answer, and the child is dead within
  :data:`DEATH_WAIT_S`), the request never ran: :func:`forward_ordinary` starts a fresh child
  (``adapter.process()``, bounded by its own startup timeout) and sends it there once more. Any
  other failure, and a second one, is the relay's retryable ``unavailable``.
"""

from __future__ import annotations

import http.client
import logging
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from werk_host.plugin import ErrorCode, InferenceResponse, JsonObject, WerkError
from werk_host.plugin.http import ClientGone, forward

if TYPE_CHECKING:
    from .adapter import LlamaCppAdapter
    from .process import LlamaServerProcess

__all__ = [
    "DEATH_WAIT_S",
    "SLOT_FIELDS",
    "SlotLease",
    "SlotRouter",
    "forward_ordinary",
    "held_for_life",
    "ordinary_capacity",
    "strip_slot_fields",
]

log = logging.getLogger(__name__)

#: Body fields by which a client could pin a llama-server slot; never relayed.
SLOT_FIELDS = ("id_slot", "slot_id")
#: After a refused or reset connection: how long to wait for the child to be seen dead.
DEATH_WAIT_S = 2.0
_DEATH_POLL_S = 0.02
#: Connection failures that happen when the child is gone before it answered anything.
_DIED = (ConnectionRefusedError, ConnectionResetError, BrokenPipeError, http.client.RemoteDisconnected)


def ordinary_capacity(n_slots: int) -> int:
    """How many ordinary requests run at once on a child with ``n_slots`` slots."""
    return max(n_slots - 1, 1)


def strip_slot_fields(body: JsonObject) -> JsonObject:
    """``body`` without the fields that pin a slot (:data:`SLOT_FIELDS`)."""
    return {k: v for k, v in body.items() if k not in SLOT_FIELDS}


class SlotLease:
    """One held ordinary slot (or, with one slot only, the held ``slot_lock``); released once."""

    def __init__(self, router: SlotRouter, slot: int, *, shared: bool) -> None:
        self.router = router
        self.slot = slot
        self.shared = shared  # the state slot itself (n == 1): slot_lock is held
        self._released = False
        self._lock = threading.Lock()

    def release(self) -> None:
        with self._lock:
            if self._released:
                return
            self._released = True
        self.router._give_back(self)


class SlotRouter:
    """Hands out the ordinary slots of one adapter's child (see the module docstring)."""

    def __init__(self, slot_lock: threading.Lock, wait_s: float) -> None:
        self.slot_lock = slot_lock
        self.wait_s = wait_s
        self._held: set[int] = set()
        self._cond = threading.Condition()

    def acquire(self, n_slots: int) -> SlotLease:
        """A free ordinary slot of a child with ``n_slots`` slots, waiting at most ``wait_s``."""
        if n_slots < 2:
            return self.hold_state_slot()
        deadline = time.monotonic() + self.wait_s
        with self._cond:
            while True:
                free = [i for i in range(n_slots - 1) if i not in self._held]
                if free:
                    self._held.add(free[0])
                    return SlotLease(self, free[0], shared=False)
                left = deadline - time.monotonic()
                if left <= 0 or not self._cond.wait(left):
                    raise _busy()

    def hold_state_slot(self) -> SlotLease:
        """``slot_lock`` (the state slot itself, slot 0 of a one-slot child or the session slot),
        waiting at most ``wait_s``; the lease's ``slot`` is meaningful only for a one-slot child."""
        if not self.slot_lock.acquire(timeout=self.wait_s):
            raise _busy()
        return SlotLease(self, 0, shared=True)

    def held(self) -> set[int]:
        with self._cond:
            return set(self._held)

    def _give_back(self, lease: SlotLease) -> None:
        if lease.shared:
            self.slot_lock.release()
            return
        with self._cond:
            self._held.discard(lease.slot)
            self._cond.notify()


def _busy() -> WerkError:
    return WerkError(ErrorCode.UNAVAILABLE, "every llama-server slot is busy; retry shortly", retryable=True)


def held_for_life(response: InferenceResponse, lease: SlotLease) -> InferenceResponse:
    """``response`` whose close (or the end of its body) also releases ``lease``."""

    def body() -> Iterator[bytes]:
        try:
            yield from response.body
        finally:
            lease.release()

    def close() -> None:
        try:
            response.close()
        finally:
            lease.release()

    return InferenceResponse(status=response.status, headers=response.headers, body=body(), close=close)


def _child_died(proc: LlamaServerProcess, err: WerkError) -> bool:
    """Whether ``err`` (a relay failure before any answer) came from the child dying."""
    if not isinstance(err.__cause__, _DIED):
        return False
    deadline = time.monotonic() + DEATH_WAIT_S
    while proc.alive():
        if time.monotonic() >= deadline:
            return False
        time.sleep(_DEATH_POLL_S)
    return True


def forward_ordinary(adapter: LlamaCppAdapter, path: str, body: JsonObject) -> InferenceResponse:
    """Relay an ordinary request on a slot chosen here, held for the response's life."""
    body = strip_slot_fields(body)
    body["cache_prompt"] = True
    for attempt in (1, 2):
        proc = adapter.process()
        lease = adapter.router.acquire(proc.effective_parallel())
        try:
            if lease.shared:
                adapter.forget_slot()  # ordinary traffic on the state slot itself
            response = forward(adapter.proxy_pool(proc), path, {**body, "id_slot": lease.slot})
        except ClientGone:
            lease.release()
            raise
        except WerkError as err:
            lease.release()
            if attempt == 1 and _child_died(proc, err):
                log.warning("llama-server (generation %s) died before answering; restarting it", proc.generation[:8])
                continue
            raise
        except BaseException:
            lease.release()
            raise
        return held_for_life(response, lease)
    raise AssertionError("unreachable")  # pragma: no cover

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
* **Owners.** Every lease names its owner (the host's opaque principal tag; :data:`ANONYMOUS`
  for callers without one) and the router books what each slot holds for whom. A slot that held
  another owner's tokens is erased before it serves (:mod:`.promptcache`), so no owner's request
  reuses another's cached prefix; a free slot already holding the longest prefix of the
  request's tokens for the same owner is preferred (slot affinity). With one slot, anything the
  adapter did on it since (state work: :attr:`LlamaCppAdapter.state_epoch`) makes it foreign.
* **Bounded waits.** Waiting for a slot (or, with n = 1, for ``slot_lock``) lasts at most
  ``slot_wait_s``; then a retryable ``unavailable``.
* **Capacity.** :func:`ordinary_capacity` (n − 1, or 1 when n = 1) is the instance's
  ``ChatLimits.max_concurrent_requests``.
* **A dead child is restarted, once.** When sending, or erasing a foreign slot before it,
  fails because the child died (the connection was refused, reset or closed before any answer,
  and the child is dead within :data:`DEATH_WAIT_S`), the request never ran:
  :func:`forward_ordinary` (and a prompt-cache lease, :mod:`.promptcache`) starts a fresh child
  (``adapter.process()``, bounded by its own startup timeout) and sends it there once more. Any
  other failure, and a second one, is the relay's retryable ``unavailable``.
"""

from __future__ import annotations

import http.client
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from werk_host.plugin import ErrorCode, InferenceResponse, JsonObject, WerkError
from werk_host.plugin.http import ClientGone, forward

from .native import NativeConnectionError, NativeError

if TYPE_CHECKING:
    from .adapter import LlamaCppAdapter
    from .process import LlamaServerProcess

__all__ = [
    "ANONYMOUS",
    "DEATH_WAIT_S",
    "SLOT_FIELDS",
    "SlotLease",
    "SlotRecord",
    "SlotRouter",
    "child_died",
    "common_prefix",
    "forward_ordinary",
    "held_for_life",
    "ordinary_capacity",
    "prepare",
    "send",
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


#: The owner of requests that name none (in-process callers, ``/v1/completions`` without a key).
ANONYMOUS = ""


@dataclass(frozen=True)
class SlotRecord:
    """What the router knows a slot holds: whose tokens (``None``: nothing, a fresh slot), the
    known leading ones, the adapter's state epoch then, and when it was last used."""

    owner: str | None = None
    tokens: tuple[int, ...] = ()
    epoch: int = 0
    used: float = 0.0


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest common prefix of two token sequences."""
    a, b = tuple(a), tuple(b)
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]: bisect on slice equality (C speed)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def ordinary_capacity(n_slots: int) -> int:
    """How many ordinary requests run at once on a child with ``n_slots`` slots."""
    return max(n_slots - 1, 1)


def strip_slot_fields(body: JsonObject) -> JsonObject:
    """``body`` without the fields that pin a slot (:data:`SLOT_FIELDS`)."""
    return {k: v for k, v in body.items() if k not in SLOT_FIELDS}


class SlotLease:
    """One held ordinary slot (or, with one slot only, the held ``slot_lock``); released once."""

    def __init__(self, router: SlotRouter, slot: int, *, shared: bool, owner: str = ANONYMOUS) -> None:
        self.router = router
        self.slot = slot
        self.shared = shared  # the state slot itself (n == 1): slot_lock is held
        self.owner = owner
        #: what the slot held before this lease (:class:`SlotRecord`)
        self.found = SlotRecord()
        #: the leading tokens the slot holds when released (booked for affinity), and the
        #: adapter's state epoch then
        self.tokens: tuple[int, ...] = ()
        self.epoch = 0
        self._released = False
        self._lock = threading.Lock()

    @property
    def foreign(self) -> bool:
        """Whether the slot may hold another owner's tokens (it must be erased before use)."""
        return self.found.owner is not None and self.found.owner != self.owner

    def held(self, tokens: Sequence[int] | None) -> int:
        """How many leading ``tokens`` the slot holds for this lease's owner, as booked."""
        if tokens is None or self.foreign:
            return 0
        return common_prefix(self.found.tokens, tokens)

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
        self._book: dict[int, SlotRecord] = {}
        self._generation: str | None = None

    def acquire(
        self,
        n_slots: int,
        *,
        owner: str = ANONYMOUS,
        tokens: Sequence[int] | None = None,
        generation: str | None = None,
        epoch: int = 0,
    ) -> SlotLease:
        """A free ordinary slot of a child with ``n_slots`` slots for ``owner``, waiting at most
        ``wait_s``: the one booked with the longest prefix of ``tokens`` for ``owner``, else a
        fresh one, else the least recently used. ``generation``: the child's (a new one holds
        nothing); ``epoch``: the adapter's state epoch (one slot only, module docstring)."""
        if n_slots < 2:
            lease = self.hold_state_slot()
            lease.owner = owner
            with self._cond:
                self._renew(generation)
                found = self._book.get(0, SlotRecord())
                lease.found = found if found.epoch == epoch else SlotRecord(owner="", epoch=epoch)
            return lease
        deadline = time.monotonic() + self.wait_s
        with self._cond:
            self._renew(generation)
            while True:
                free = [i for i in range(n_slots - 1) if i not in self._held]
                if free:
                    slot = max(free, key=lambda i: self._rank(i, owner, tokens))
                    self._held.add(slot)
                    lease = SlotLease(self, slot, shared=False, owner=owner)
                    lease.found = self._book.get(slot, SlotRecord())
                    return lease
                left = deadline - time.monotonic()
                if left <= 0 or not self._cond.wait(left):
                    raise _busy()

    def _renew(self, generation: str | None) -> None:
        if generation is not None and generation != self._generation:
            self._generation = generation
            self._book.clear()

    def _rank(self, slot: int, owner: str, tokens: Sequence[int] | None) -> tuple[int, int, float]:
        record = self._book.get(slot, SlotRecord())
        mine = record.owner == owner
        shared = common_prefix(record.tokens, tokens) if mine and tokens is not None else 0
        return (shared, int(record.owner is None or mine), -record.used)

    def book(self, slot: int, record: SlotRecord) -> None:
        """Record what ``slot`` holds now (after an erase, a restore or a request)."""
        with self._cond:
            self._book[slot] = record

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
        record = SlotRecord(lease.owner, lease.tokens, lease.epoch, time.monotonic())
        if lease.shared:
            with self._cond:
                self._book[0] = record
            self.slot_lock.release()
            return
        with self._cond:
            self._book[lease.slot] = record
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

    source = response.source  # the body passes b"" on (werk_host.plugin.Pumpable)
    return InferenceResponse(response.status, response.headers, body(), close, source)


def child_died(proc: LlamaServerProcess, err: WerkError) -> bool:
    """Whether ``err`` (a relay failure before any answer, or a failed slot erase) came from
    the child dying."""
    cause = err.__cause__
    if isinstance(cause, NativeConnectionError):  # the erase of :func:`prepare`
        cause = cause.__cause__
    if not isinstance(cause, _DIED):
        return False
    deadline = time.monotonic() + DEATH_WAIT_S
    while proc.alive():
        if time.monotonic() >= deadline:
            return False
        time.sleep(_DEATH_POLL_S)
    return True


def prepare(adapter: LlamaCppAdapter, proc: LlamaServerProcess, lease: SlotLease) -> None:
    """Make ``lease``'s slot fit for its owner: erased when it may hold another owner's tokens
    (a failed erase is a retryable ``unavailable``: isolation is never assumed)."""
    if lease.shared:
        adapter.forget_slot()  # ordinary traffic on the state slot itself
    if not lease.foreign:
        return
    try:
        adapter.client(proc).slot_erase(lease.slot, timeout=adapter.config.backend_bounds.call_s)
    except NativeError as err:
        raise adapter.native_failure(err, "slot erase") from err
    lease.found = SlotRecord(epoch=lease.found.epoch)


def send(
    adapter: LlamaCppAdapter, proc: LlamaServerProcess, lease: SlotLease, path: str, body: JsonObject
) -> InferenceResponse:
    """Relay ``body`` (its slot fields dropped, ``cache_prompt`` on) to ``path`` on ``lease``'s
    slot of ``proc``; the caller releases the lease."""
    body = strip_slot_fields(body)
    body["cache_prompt"] = True
    body["id_slot"] = lease.slot
    return forward(adapter.proxy_pool(proc), path, body)


def forward_ordinary(
    adapter: LlamaCppAdapter, path: str, body: JsonObject, owner: str = ANONYMOUS
) -> InferenceResponse:
    """Relay an ordinary request of ``owner`` on a slot chosen here, held for the response's life."""
    for attempt in (1, 2):
        proc = adapter.process()
        lease = adapter.router.acquire(
            proc.effective_parallel(), owner=owner, generation=proc.generation, epoch=adapter.state_epoch
        )
        try:
            prepare(adapter, proc, lease)
            lease.epoch = adapter.state_epoch
            response = send(adapter, proc, lease, path, body)
        except ClientGone:
            lease.release()
            raise
        except WerkError as err:
            lease.release()
            if attempt == 1 and child_died(proc, err):
                log.warning("llama-server (generation %s) died before answering; restarting it", proc.generation[:8])
                continue
            raise
        except BaseException:
            lease.release()
            raise
        return held_for_life(response, lease)
    raise AssertionError("unreachable")  # pragma: no cover

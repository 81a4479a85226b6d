"""The inference admission gate: inference never takes the last worker threads.

Every generation request (``/v1/chat/completions``, ``/v1/completions``, and through them
Anthropic ``/v1/messages`` and Ollama ``/api/chat`` and ``/api/generate``) holds one HTTP worker
thread from its first byte to the end of its relayed answer, and so does a request *waiting*
for the backend. So does every ``/werk/v1/prefill`` and ``/werk/v1/decode`` (the model runs
inside them too), and they hold tickets of the same gate, under the same host-wide and per-key
bounds and refusals. The gate bounds them at three levels (docs/operations.md, "Inference
concurrency"):

* **host-wide**: at most :attr:`GateLimits.host` generation requests, running *or waiting*,
  are inside the gate. The bound is strictly below the server's thread count, so the threads
  above it are always free for control routes (``/werk/v1/*``, ``/metrics``) and health.
* **per key**: one principal holds at most :attr:`GateLimits.per_key` of them (running or
  waiting), so one key cannot take every inference thread. Without configured keys every
  request is the shared local principal: one key.
* **per instance**: at most its capacity run at once (the backend's
  ``ChatLimits.max_concurrent_requests``, e.g. llama.cpp's ordinary slots; unknown,
  :attr:`GateLimits.slots`, unless the backend queues beyond its capacity itself,
  ``ChatLimits.engine_queues``, e.g. vLLM's scheduler or a remote server: then the instance has no
  bound of its own below the host-wide one); up to :attr:`GateLimits.queue` more (default: the per-key bound,
  so that one key's whole allowance waits on an instance rather than being refused, while an
  instance still holds well under the host-wide bound) wait, first come first served, at most
  :attr:`GateLimits.wait_s` seconds each. Prefill and decode are seated apart from chats, on
  the instance's own :func:`state_seats` (capacity :attr:`GateLimits.slots`, the same queue
  and wait): a backend runs them on its own state slot (llama.cpp's last slot), never on the
  ordinary slots the chat capacity counts, so neither kind waits for a seat the other holds.

The host-wide and per-key bounds never wait: a request over them is refused at once, since a
waiting request would hold a thread too. An instance whose queue is full refuses at once; a
queued request that is not seated in time is refused then. Refusals are retryable
:class:`~werk_host.errors.WerkError` s carrying :data:`RETRY_AFTER` (seconds) in their details,
which the HTTP layer sends as ``Retry-After``: over the per-key bound ``resource_exhausted``
(429), otherwise ``unavailable`` (503; Anthropic's 529 ``overloaded_error``). A queued request
whose client goes away leaves the queue within :data:`POLL_S`.

A :class:`Ticket` is released exactly once (:meth:`Ticket.release` is idempotent), when the
relayed answer is closed: after its end, an error, or the client's disconnect; a prefill's or
decode's when the operation returns or raises (a ticket is a context manager for that).
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from werk_host.config import ServerLimits
from werk_host.errors import RETRY_AFTER as RETRY_AFTER
from werk_host.errors import ErrorCode, WerkError

#: How often a queued request checks that its client is still there.
POLL_S: Final = 0.25


@dataclass(frozen=True)
class GateLimits:
    """The gate's bounds (module docstring); ``queue`` ``None``: ``per_key``."""

    host: int
    per_key: int
    slots: int = 4
    queue: int | None = None
    wait_s: float = 30.0
    retry_after_s: int = 2

    def __post_init__(self) -> None:
        if self.host < 1 or self.per_key < 1 or self.slots < 1:
            raise ValueError("inference bounds must be at least 1")
        if self.queue is not None and self.queue < 0:
            raise ValueError("the inference queue bound cannot be negative")
        if not 0 < self.wait_s < math.inf or self.retry_after_s < 1:
            raise ValueError("the inference wait and retry-after must be positive")

    @property
    def queue_bound(self) -> int:
        return self.queue if self.queue is not None else self.per_key


def state_seats(instance: str) -> str:
    """The seats of ``instance``'s prefills and decodes (module docstring), apart from the
    seats named by the instance id itself, which its chats and completions take."""
    return f"{instance} prefill/decode"


def _refusal(code: ErrorCode, message: str, openai_code: str, retry_after_s: int) -> WerkError:
    return WerkError(code, message, retryable=True, details={RETRY_AFTER: retry_after_s, "openai_code": openai_code})


@dataclass
class _Seats:
    """One instance's running count, capacity and FIFO of waiting tickets."""

    capacity: int
    running: int = 0
    waiting: deque[object] = field(default_factory=deque)


class InferenceGate:
    """The host's one gate (module docstring). Thread-safe."""

    def __init__(self, limits: GateLimits) -> None:
        self.limits = limits
        self._cond = threading.Condition()
        self._inside = 0
        self._per_key: dict[str, int] = {}
        self._seats: dict[str, _Seats] = {}

    def enter(self, principal_id: str) -> Ticket:
        """A ticket inside the host-wide and per-key bounds, or a refusal (never waits)."""
        limits = self.limits
        with self._cond:
            held = self._per_key.get(principal_id, 0)
            if held >= limits.per_key:
                raise _refusal(
                    ErrorCode.RESOURCE_EXHAUSTED,
                    f"this key already has {held} inference requests in progress (the limit); retry later",
                    "rate_limit_exceeded",
                    limits.retry_after_s,
                )
            if self._inside >= limits.host:
                raise _refusal(
                    ErrorCode.UNAVAILABLE,
                    "the host is serving its maximum of concurrent inference requests; retry later",
                    "overloaded",
                    limits.retry_after_s,
                )
            self._inside += 1
            self._per_key[principal_id] = held + 1
        return Ticket(self, principal_id)

    def _seat(
        self, ticket: Ticket, instance: str, capacity: int | None, gone: Callable[[], bool] | None, engine_queues: bool
    ) -> None:
        limits = self.limits
        if capacity is None or capacity < 1:
            capacity = limits.host if engine_queues else limits.slots
        deadline = time.monotonic() + limits.wait_s
        with self._cond:
            seats = self._seats.get(instance)
            if seats is None:
                seats = self._seats[instance] = _Seats(capacity)
            seats.capacity = capacity
            if not seats.waiting and seats.running < capacity:
                seats.running += 1
                return
            if len(seats.waiting) >= limits.queue_bound:
                raise self._busy()
            seats.waiting.append(ticket)
            try:
                while not (seats.waiting[0] is ticket and seats.running < seats.capacity):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise self._busy()
                    if gone is not None and gone():
                        raise WerkError(ErrorCode.UNAVAILABLE, "the client went away while queued", retryable=True)
                    self._cond.wait(min(left, POLL_S))
                seats.running += 1
            finally:
                seats.waiting.remove(ticket)
                self._cond.notify_all()  # the next in line may be seated now

    def _busy(self) -> WerkError:
        return _refusal(
            ErrorCode.UNAVAILABLE,
            "the serving instance is at capacity and its queue did not move in time; retry later",
            "overloaded",
            self.limits.retry_after_s,
        )

    def _release(self, ticket: Ticket, instance: str | None) -> None:
        with self._cond:
            if instance is not None:
                seats = self._seats[instance]
                seats.running -= 1
            self._inside -= 1
            left = self._per_key[ticket.principal_id] - 1
            if left:
                self._per_key[ticket.principal_id] = left
            else:
                del self._per_key[ticket.principal_id]
            self._cond.notify_all()


class Ticket:
    """One request inside the gate: :meth:`seat` it on its instance, :meth:`release` it once."""

    def __init__(self, gate: InferenceGate, principal_id: str) -> None:
        self.gate = gate
        self.principal_id = principal_id
        self._instance: str | None = None
        self._released = False

    def seat(
        self,
        instance: str,
        capacity: int | None,
        gone: Callable[[], bool] | None = None,
        *,
        engine_queues: bool = False,
    ) -> None:
        """Run on ``instance`` (``capacity`` concurrent requests; ``None``: unknown, see the module
        docstring for ``engine_queues``), queueing when it is full; raises the refusal when the
        queue is full or the wait ran out."""
        self.gate._seat(self, instance, capacity, gone, engine_queues)
        self._instance = instance

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        self.gate._release(self, self._instance)

    def __enter__(self) -> Ticket:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def gate_limits(server: ServerLimits) -> GateLimits:
    """The gate's bounds for ``server``: unset, the host-wide bound leaves a reserve of
    ``max(2, threads // 4)`` threads free of inference and one key gets half of it (rounded up).
    Raises ``ValueError`` for a host-wide bound below 1 or not below the thread count."""
    host = server.inference_max
    if host is None:
        host = server.threads - max(2, server.threads // 4)
    if not 1 <= host < server.threads:
        raise ValueError(
            f"the host-wide inference bound ({host}) must be at least 1 and below the thread count "
            f"({server.threads}): raise --threads or lower --inference-max"
        )
    per_key = server.inference_per_key if server.inference_per_key is not None else math.ceil(host / 2)
    return GateLimits(
        host=host,
        per_key=min(per_key, host),
        slots=server.inference_slots,
        queue=server.inference_queue,
        wait_s=server.inference_wait_s,
        retry_after_s=server.inference_retry_after_s,
    )

"""Worker observations for the inventory, answered from what is known when a backend hangs.

``GET /werk/v1/deployments`` reports each ready instance's worker (pid, slots) from the
backend's ``werk_workers`` hook, which may ask the backend itself (llama.cpp reads
``/slots``). A stopped or overloaded backend must not hold that listing (docs/operations.md,
"Backend failures"). The contract of :class:`WorkerWatch`:

* Each instance has at most one observation call running, on its own daemon thread, never on
  the request's; the call's own bound is the backend's (``werk serve --backend-timeout``).
* A request waits for that call at most ``wait_s`` (:data:`WAIT_S`); an observation younger
  than ``fresh_s`` (:data:`FRESH_S`) is answered without a call, unless a process it names has
  exited since (a backend that replaces its own child keeps its adapter: the dead pid is the
  evidence that the observation is stale).
* A call that has not finished (or that failed) leaves the last completed observation of the
  same adapter in place, which is what the request gets; with none, ``None`` (the inventory's
  worker fields are then null: unknown, never guessed). A new adapter on the instance (a
  restart) starts with no observation.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil  # type: ignore[import-untyped]

from werk_host.protocol.telemetry import WorkerObservation
from werk_host.seam import Adapter

log = logging.getLogger(__name__)

#: The longest a request waits for an observation call.
WAIT_S = 1.0
#: An observation this young is answered as it is.
FRESH_S = 1.0

Observe = Callable[[Adapter], list[WorkerObservation] | None]


@dataclass
class _Entry:
    adapter: Adapter
    latest: list[WorkerObservation] | None = None
    observed: float = float("-inf")
    pending: threading.Event | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


class WorkerWatch:
    """The last worker observation per instance (see the module docstring). Thread-safe."""

    def __init__(self, *, wait_s: float = WAIT_S, fresh_s: float = FRESH_S) -> None:
        self.wait_s = wait_s
        self.fresh_s = fresh_s
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()

    def observe(self, key: str, adapter: Adapter, call: Observe) -> list[WorkerObservation] | None:
        """``call(adapter)``'s answer, or the last known one when it does not come within ``wait_s``."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry.adapter is not adapter:
                entry = self._entries[key] = _Entry(adapter)
        with entry.lock:
            if time.monotonic() - entry.observed < self.fresh_s and _all_alive(entry.latest):
                return entry.latest
            pending = entry.pending
            if pending is None:
                pending = entry.pending = threading.Event()
                threading.Thread(
                    target=self._refresh, args=(key, entry, call, pending), name="werk-observe", daemon=True
                ).start()
        pending.wait(self.wait_s)
        with entry.lock:
            return entry.latest

    def last(self, key: str, adapter: Adapter) -> list[WorkerObservation] | None:
        """The last completed observation of ``adapter`` on ``key``, without a call; ``None``
        when there is none."""
        with self._lock:
            entry = self._entries.get(key)
        if entry is None or entry.adapter is not adapter:
            return None
        with entry.lock:
            return entry.latest

    @staticmethod
    def _refresh(key: str, entry: _Entry, call: Observe, done: threading.Event) -> None:
        try:
            latest = call(entry.adapter) or []
        except Exception as err:
            log.warning("observing the workers of instance %s failed: %s", key, type(err).__name__)
            latest = None
        with entry.lock:
            if latest is not None:
                entry.latest, entry.observed = latest, time.monotonic()
            entry.pending = None
        done.set()


def _all_alive(observed: list[WorkerObservation] | None) -> bool:
    """Whether every process an observation names still runs (a zombie has exited)."""
    for worker in observed or ():
        if worker.pid is None:
            continue
        try:
            if psutil.Process(worker.pid).status() == psutil.STATUS_ZOMBIE:
                return False
        except psutil.Error:
            return False
    return True

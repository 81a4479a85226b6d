"""A bounded LRU of Werk-owned model workers, one per exact model, shared by the adapters that
serve that model (docs/plugin-kit.md, "Processes"). For backends whose engine holds a model in
a worker process of its own (the seed's Transformers and ONNX Runtime GenAI rows: "one
serialized Werk-owned worker per exact model ... bounded LRU, default capacity 1").

Contract:

* **Key.** A worker is keyed by any hashable value the backend chooses; it should hold
  :func:`files_identity` of the manifest (a SHA-256 over every file's path, size and SHA-256,
  so a changed file is another model, while two names for the same files share a worker) and
  every runtime setting that changes what runs (interpreter, device, dtype, threads).
* **Serialized.** :meth:`Slot.hold` is the worker's one seat, held by a request from before it
  is sent until its answer ends (docs/plugin-kit.md, "Concurrency and cancellation"); waiting
  gives up when the client has gone. Cheap calls (a token count) may go to the worker outside it.
* **Bounded LRU.** :meth:`WorkerPool.use` starts a key's worker when none is alive (a dead one,
  killed or crashed, is replaced by a new generation), after stopping least recently used
  *idle* workers until the loaded ones, the new one included, fit the capacity (read on each
  start, at least 1). A busy worker is never stopped: the pool then runs over its bound until
  the work ends, and logs it.
* **Lifetime.** Each worker is a :class:`Started`: a :class:`~werk_host.plugin.workers.WorkerRun`
  (the kit's guard: it dies with ``werk serve``) and its connection pool.
  :meth:`WorkerPool.detach` stops a worker once no adapter is attached to its key.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field

from werk_host.backends.relay import ConnectionPool
from werk_host.errors import ErrorCode, WerkError
from werk_host.models import ModelManifest
from werk_host.plugin.workers import WorkerRun
from werk_host.seam import client_disconnected

__all__ = ["Slot", "Started", "WorkerPool", "files_identity"]

log = logging.getLogger(__name__)


def files_identity(manifest: ModelManifest) -> str:
    """The exact model: a SHA-256 over each file's path, size and SHA-256 (not the manifest's
    name or params)."""
    files = sorted((f.path, f.bytes, f.sha256) for f in manifest.files)
    return hashlib.sha256(json.dumps(files).encode()).hexdigest()


@dataclass
class Started:
    """A started worker: its run and the connection pool to it."""

    run: WorkerRun
    pool: ConnectionPool


@dataclass
class Slot:
    """One key's worker place in the pool: the live worker (if any) and its serializing lock."""

    key: Hashable
    started: Started | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    start_lock: threading.Lock = field(default_factory=threading.Lock)
    users: set[int] = field(default_factory=set)
    busy: int = 0
    last_used: float = 0.0

    def alive(self) -> bool:
        return self.started is not None and self.started.run.alive()

    def generation(self) -> str | None:
        return self.started.run.generation if self.alive() and self.started is not None else None

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """The worker's one generation seat, in turn; gives up (retryable ``unavailable``) when
        the client went away while waiting (docs/plugin-kit.md, "Concurrency and cancellation")."""
        gone = client_disconnected.get()
        while not self.lock.acquire(timeout=0.1):
            if gone is not None and gone():
                raise WerkError(ErrorCode.UNAVAILABLE, "the client went away", retryable=True)
        try:
            yield
        finally:
            self.lock.release()

    def stop(self) -> None:
        started, self.started = self.started, None
        if started is not None:
            started.pool.close()
            started.run.stop()


class WorkerPool:
    """The workers of one backend in this process (module docstring); ``capacity`` is called on
    each start, so an environment variable read there takes effect without a restart."""

    def __init__(self, capacity: Callable[[], int]) -> None:
        self._capacity = capacity
        self._lock = threading.Lock()
        self._slots: dict[Hashable, Slot] = {}

    def attach(self, key: Hashable, user: int) -> Slot:
        with self._lock:
            slot = self._slots.setdefault(key, Slot(key))
            slot.users.add(user)
            return slot

    def detach(self, key: Hashable, user: int) -> None:
        with self._lock:
            slot = self._slots.get(key)
            if slot is None:
                return
            slot.users.discard(user)
            if slot.users:
                return
            del self._slots[key]
        slot.stop()

    def loaded(self) -> int:
        with self._lock:
            return sum(1 for s in self._slots.values() if s.alive())

    @contextlib.contextmanager
    def use(self, slot: Slot, start: Callable[[], Started]) -> Iterator[Started]:
        """``slot``'s live worker (started by ``start`` when none is alive), marked busy and most
        recently used while the block runs."""
        with self._lock:
            slot.busy += 1
            slot.last_used = time.monotonic()
        try:
            yield self._ensure(slot, start)
        finally:
            with self._lock:
                slot.busy -= 1
                slot.last_used = time.monotonic()

    def _ensure(self, slot: Slot, start: Callable[[], Started]) -> Started:
        with slot.start_lock:
            if slot.alive() and slot.started is not None:
                return slot.started
            slot.stop()  # a dead worker: release its run directory and connections
            self._make_room(slot)
            slot.started = start()
            return slot.started

    def _make_room(self, incoming: Slot) -> None:
        """Stop least recently used idle workers until ``incoming`` fits the capacity."""
        capacity = max(1, self._capacity())
        while True:
            with self._lock:
                loaded = [s for s in self._slots.values() if s is not incoming and s.alive()]
                if len(loaded) < capacity:
                    return
                idle = sorted((s for s in loaded if s.busy == 0), key=lambda s: s.last_used)
                if not idle:
                    log.warning("all %d loaded workers are busy: running one over the model LRU bound", len(loaded))
                    return
                victim = idle[0]
            log.info("model LRU full (%d): stopping the least recently used worker", capacity)
            victim.stop()

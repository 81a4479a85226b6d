"""The memory manager: telemetry, pressure, reservations, relief and release.

Accounting model (documented choice)
------------------------------------
For a pool with a fresh sample, *projected use* is::

    max(observed_used, managed_bytes) + reserved_bytes

``observed_used = capacity - available`` already contains committed backend
state once the backend has allocated it, so managed bytes are only added where
they exceed what is observed (a sample taken before the allocation shows up, or
a backend that hides its memory from the sample). Reserved bytes are for loads
that have not happened yet and are always added. Pressure and admission both
use projected use; a reservation is admitted only while
``100 * (projected + request) < hard_pct * capacity``. Unknown capacity never
admits (``unavailable``): Werk does not assume that an unknown pool has room.

Unified topology makes ``host`` and ``accelerator`` one pool: both tier views in
the report show the same figures and a reservation in either tier charges it.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum
from types import TracebackType
from typing import Any, Literal

from werk_host.errors import ErrorCode, WerkError, exhausted, internal, invalid, unavailable
from werk_host.memory.base import (
    DEFAULT_THRESHOLDS,
    MemorySample,
    MemoryTier,
    Pressure,
    Thresholds,
    Topology,
    classify_pressure,
    worst_pressure,
)
from werk_host.memory.relief import ReliefCandidate, ReliefExecutor, ReliefKind, plan_relief
from werk_host.memory.telemetry import TelemetrySource, detect_topology, is_apple_silicon
from werk_host.protocol.telemetry import MemoryCounters

_log = logging.getLogger(__name__)

CapabilityEvidence = tuple[Literal["supported", "unavailable"], str]

#: The memory counters, in report order: the fields of the protocol's ``MemoryCounters``.
COUNTER_NAMES: tuple[str, ...] = tuple(MemoryCounters.model_fields)


class _Status(Enum):
    ACTIVE = "active"
    COMMITTED = "committed"
    RELEASING = "releasing"
    RELEASED = "released"


class MemoryReservation:
    """Capacity held for one pending backend operation.

    Use as a context manager: on exit (normal or exceptional) an uncommitted
    reservation is released; a committed one is left to its allocation.
    """

    __slots__ = ("_manager", "_status", "id", "nbytes", "state_id", "tier")

    def __init__(self, manager: MemoryManager, rid: str, tier: MemoryTier, nbytes: int, state_id: str | None):
        self._manager = manager
        self._status = _Status.ACTIVE
        self.id = rid
        self.tier = tier
        self.nbytes = nbytes
        self.state_id = state_id

    @property
    def active(self) -> bool:
        return self._status is _Status.ACTIVE

    def commit(self, actual_bytes: int | None) -> Allocation:
        return self._manager.commit(self, actual_bytes)

    def release(self) -> None:
        self._manager.release_reservation(self)

    def __enter__(self) -> MemoryReservation:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._manager.release_reservation(self)

    def __repr__(self) -> str:
        return (
            f"MemoryReservation(id={self.id!r}, tier={self.tier.value!r}, nbytes={self.nbytes}, {self._status.value})"
        )


class Allocation:
    """A committed, managed allocation of ``nbytes`` (known size) in ``tier``.

    ``pinned`` becomes true after a failed backend release: the bytes stay
    accounted and policy movement must skip the state.
    """

    __slots__ = ("_manager", "_orphaned", "_pinned", "_status", "id", "nbytes", "state_id", "tier")

    def __init__(self, manager: MemoryManager, aid: str, tier: MemoryTier, nbytes: int, state_id: str | None):
        self._manager = manager
        self._status = _Status.COMMITTED
        self._pinned = False
        self._orphaned = False
        self.id = aid
        self.tier = tier
        self.nbytes = nbytes
        self.state_id = state_id

    @property
    def pinned(self) -> bool:
        return self._pinned

    @property
    def released(self) -> bool:
        return self._status is _Status.RELEASED

    def release(self, backend_release: Callable[[], None]) -> None:
        self._manager.release(self, backend_release)

    def __repr__(self) -> str:
        return (
            f"Allocation(id={self.id!r}, tier={self.tier.value!r}, nbytes={self.nbytes}, "
            f"pinned={self._pinned}, {self._status.value})"
        )


@dataclass
class _Pool:
    reserved: int = 0
    managed: int = 0
    pressure: Pressure = Pressure.UNKNOWN  # hysteresis memory: last known class


@dataclass(frozen=True)
class _Observation:
    at: float
    sample: MemorySample | None
    failed: bool


@dataclass(frozen=True)
class _Denied:
    used: int
    capacity: int


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


class MemoryManager:
    """Thread-safe host/accelerator accounting (see the module docstring).

    ``clock`` is monotonic seconds (cooldown, sample age); ``wall_clock`` is Unix
    seconds (``observed_at_unix_ms``, ``last_action_unix_ms``). ``topology``
    overrides detection (``unified`` merges the pools); by default Apple silicon
    is unified and otherwise the accelerator source decides.
    """

    def __init__(
        self,
        host_source: TelemetrySource | None,
        accelerator_source: TelemetrySource | None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        *,
        topology: Topology | None = None,
        thresholds: Thresholds = DEFAULT_THRESHOLDS,
        cooldown_s: float = 5.0,
        max_relief_actions: int = 8,
    ) -> None:
        if cooldown_s < 0 or max_relief_actions < 0:
            raise ValueError("cooldown and action bound must be non-negative")
        self._host = host_source
        self._accel = accelerator_source
        self._clock = clock
        self._wall = wall_clock
        self._fixed_topology = Topology(topology) if topology is not None else None
        self._unified = self._fixed_topology is Topology.UNIFIED if topology is not None else is_apple_silicon()
        self._thresholds = thresholds
        self._cooldown_s = cooldown_s
        self._max_actions = max_relief_actions
        self._lock = threading.RLock()
        self._ids = itertools.count(1)
        self._pools: dict[MemoryTier, _Pool] = {t: _Pool() for t in MemoryTier}
        self._reservations: dict[str, MemoryReservation] = {}
        self._allocations: dict[str, Allocation] = {}
        self._obs: dict[MemoryTier, _Observation] = {}
        self._counters: dict[str, int] = dict.fromkeys(COUNTER_NAMES, 0)
        self._last_action_unix_ms: int | None = None
        self._last_action_mono: float | None = None
        self._relief_running = False

    # ------------------------------------------------------------------ pools/telemetry

    @property
    def thresholds(self) -> Thresholds:
        return self._thresholds

    @property
    def unified(self) -> bool:
        return self._unified

    def _pool_of(self, tier: MemoryTier) -> MemoryTier:
        return MemoryTier.HOST if self._unified else tier

    def _pool_keys(self) -> tuple[MemoryTier, ...]:
        return (MemoryTier.HOST,) if self._unified else (MemoryTier.HOST, MemoryTier.ACCELERATOR)

    def _source(self, pool: MemoryTier) -> TelemetrySource | None:
        return self._host if pool is MemoryTier.HOST else self._accel

    def _observe(self, pool: MemoryTier) -> MemorySample | None:
        """Take a fresh sample of ``pool`` (outside the lock); count failures."""
        source = self._source(pool)
        failed = False
        sample: MemorySample | None = None
        if source is not None:
            try:
                got = source.sample()
                if got is not None and not isinstance(got, MemorySample):
                    raise TypeError("telemetry source returned a non-sample")
                sample = got
            except Exception:
                failed = True
                _log.warning("memory telemetry sample failed for %s", pool.value, exc_info=True)
        with self._lock:
            if failed:
                self._counters["telemetry_errors"] += 1
            self._obs[pool] = _Observation(self._clock(), sample, failed)
        return sample

    def _projected_locked(self, pool: MemoryTier, sample: MemorySample) -> int:
        state = self._pools[pool]
        return max(sample.used_bytes, state.managed) + state.reserved

    def topology(self) -> Topology:
        if self._fixed_topology is not None:
            return self._fixed_topology
        return detect_topology(self._accel, unified=self._unified)

    # ------------------------------------------------------------------ report

    def report(self) -> dict[str, Any]:
        """A fresh ``/werk/v1/memory`` document, exactly the protocol's shape (docs/openapi.json).

        Each pool is sampled now; a failed or unknown sample yields null
        capacity/availability and ``unknown`` pressure while managed/reserved
        bytes and counters stay visible.
        """
        samples = {pool: self._observe(pool) for pool in self._pool_keys()}
        topology = self.topology()
        with self._lock:
            views: dict[MemoryTier, dict[str, Any]] = {}
            for pool, sample in samples.items():
                state = self._pools[pool]
                if sample is None:
                    pressure = Pressure.UNKNOWN
                else:
                    pressure = classify_pressure(
                        self._projected_locked(pool, sample),
                        sample.capacity_bytes,
                        state.pressure,
                        self._thresholds,
                    )
                    state.pressure = pressure
                views[pool] = {
                    "capacity_bytes": None if sample is None else sample.capacity_bytes,
                    "available_bytes": None if sample is None else sample.available_bytes,
                    "managed_bytes": state.managed,
                    "reserved_bytes": state.reserved,
                    "pressure": pressure.value,
                }
            if self._unified:
                views[MemoryTier.ACCELERATOR] = dict(views[MemoryTier.HOST])
            overall = worst_pressure([Pressure(v["pressure"]) for v in views.values()])
            return {
                "observed_at_unix_ms": int(self._wall() * 1000),
                "overall_pressure": overall.value,
                "topology": topology.value,
                "host": views[MemoryTier.HOST],
                "accelerator": views[MemoryTier.ACCELERATOR],
                "last_action_unix_ms": self._last_action_unix_ms,
                "counters": self._counters_locked(),
            }

    def _counters_locked(self) -> dict[str, int]:
        out = dict(self._counters)
        out["active_reservations"] = len(self._reservations)
        out["managed_allocations"] = len(self._allocations)
        return out

    def counters(self) -> dict[str, int]:
        """The counter map alone (no sampling)."""
        with self._lock:
            return self._counters_locked()

    # ------------------------------------------------------------------ latch

    @property
    def cleanup_latched(self) -> bool:
        with self._lock:
            return self._counters["backend_cleanup_latched"] == 1

    def check_mutation_allowed(self) -> None:
        """Raise ``unavailable`` (not retryable) while the backend-cleanup latch is set."""
        with self._lock:
            if self._counters["backend_cleanup_latched"]:
                raise unavailable(
                    "backend cleanup could not be confirmed; state mutation is blocked until cleared",
                    retryable=False,
                )

    def clear_cleanup_latch(self) -> None:
        """Operator acknowledgement: unblock mutation. Pinned allocations stay pinned
        and accounted until a backend release succeeds."""
        with self._lock:
            self._counters["backend_cleanup_latched"] = 0

    def record_backend_cleanup_failure(self, nbytes: int | None = None) -> None:
        """Service-level cleanup failure outside a managed allocation: counts
        ``backend_cleanup_failures``, adds a known size to ``orphaned_release_bytes``
        (unknown adds zero) and sets the latch."""
        with self._lock:
            self._counters["backend_cleanup_failures"] += 1
            if nbytes is not None and _positive_int(nbytes):
                self._counters["orphaned_release_bytes"] += nbytes
            self._counters["backend_cleanup_latched"] = 1

    def pinned_state_ids(self) -> frozenset[str]:
        """State ids of allocations pinned by a failed release."""
        with self._lock:
            return frozenset(a.state_id for a in self._allocations.values() if a.pinned and a.state_id)

    # ------------------------------------------------------------------ reservations

    def reserve(
        self,
        tier: MemoryTier | str,
        nbytes: int,
        *,
        relief: ReliefExecutor | None = None,
        state_id: str | None = None,
    ) -> MemoryReservation:
        """Reserve ``nbytes`` (positive int) in ``tier`` before a backend operation.

        Admitted when projected use plus ``nbytes`` stays below the hard
        threshold. Raises ``invalid_request`` for a bad tier/size, ``unavailable``
        when the pool's capacity is unknown or the cleanup latch is set, and
        ``resource_exhausted`` (retryable) when denied. On denial, if ``relief``
        is given and no cooldown or other pass is active, one bounded relief plan
        runs and, if it attempted any action, the reservation is retried once.
        """
        try:
            tier = MemoryTier(tier)
        except ValueError:
            raise invalid("unknown memory tier") from None
        if not _positive_int(nbytes):
            raise invalid("a reservation needs a positive integer byte count")
        self.check_mutation_allowed()
        outcome = self._admit(tier, nbytes, state_id)
        if isinstance(outcome, MemoryReservation):
            return outcome
        if relief is None or not self._relieve(tier, nbytes, outcome, relief):
            raise exhausted("memory reservation denied: the request would reach the hard pressure threshold")
        outcome = self._admit(tier, nbytes, state_id)
        if isinstance(outcome, MemoryReservation):
            return outcome
        raise exhausted("memory reservation denied after one relief pass")

    def _admit(self, tier: MemoryTier, nbytes: int, state_id: str | None) -> MemoryReservation | _Denied:
        pool = self._pool_of(tier)
        sample = self._observe(pool)
        if sample is None:
            raise unavailable(f"{tier.value} memory capacity is unknown; a reservation cannot be admitted")
        with self._lock:
            self.check_mutation_allowed()
            used = self._projected_locked(pool, sample)
            if 100 * (used + nbytes) >= self._thresholds.hard_pct * sample.capacity_bytes:
                return _Denied(used=used, capacity=sample.capacity_bytes)
            res = MemoryReservation(self, f"res-{next(self._ids)}", tier, nbytes, state_id)
            self._reservations[res.id] = res
            self._pools[pool].reserved += nbytes
            return res

    def release_reservation(self, reservation: MemoryReservation) -> None:
        """Return an uncommitted reservation's bytes. Idempotent."""
        with self._lock:
            self._own(reservation._manager)
            if reservation._status is _Status.ACTIVE:
                self._drop_reservation_locked(reservation, _Status.RELEASED)

    def _drop_reservation_locked(self, reservation: MemoryReservation, status: _Status) -> None:
        reservation._status = status
        self._reservations.pop(reservation.id, None)
        self._pools[self._pool_of(reservation.tier)].reserved -= reservation.nbytes

    def _own(self, manager: MemoryManager) -> None:
        if manager is not self:
            raise invalid("reservation or allocation belongs to another memory manager")

    def commit(self, reservation: MemoryReservation, actual_bytes: int | None) -> Allocation:
        """Turn a reservation into a managed allocation of ``actual_bytes``.

        Accounting is committed only when the backend's returned state agrees:
        ``0 < actual_bytes <= reservation.nbytes``. Otherwise the reservation is
        released and ``internal`` is raised (the caller must discard the state).
        A non-active reservation raises ``conflict``.
        """
        with self._lock:
            self._own(reservation._manager)
            if reservation._status is not _Status.ACTIVE:
                raise WerkError(ErrorCode.CONFLICT, "reservation is not active")
            if actual_bytes is None or not _positive_int(actual_bytes) or actual_bytes > reservation.nbytes:
                self._drop_reservation_locked(reservation, _Status.RELEASED)
                raise internal("backend state does not agree with its memory reservation")
            self._drop_reservation_locked(reservation, _Status.COMMITTED)
            alloc = Allocation(self, f"alloc-{next(self._ids)}", reservation.tier, actual_bytes, reservation.state_id)
            self._allocations[alloc.id] = alloc
            self._pools[self._pool_of(alloc.tier)].managed += actual_bytes
            return alloc

    def release(self, allocation: Allocation, backend_release: Callable[[], None]) -> None:
        """Release an allocation with its state lease.

        ``backend_release`` runs outside the lock. On success the bytes leave
        accounting (and any orphaned bytes it held are no longer orphaned). If it
        raises, the allocation stays accounted and pinned; ``failed_releases`` and
        ``backend_cleanup_failures`` count it, its size is added once to
        ``orphaned_release_bytes``, the latch is set, and ``unavailable`` (not
        retryable) is raised. Releasing a released allocation is a no-op; a
        concurrent release raises ``conflict``.
        """
        with self._lock:
            self._own(allocation._manager)
            if allocation._status is _Status.RELEASED:
                return
            if allocation._status is _Status.RELEASING:
                raise WerkError(ErrorCode.CONFLICT, "allocation release already in progress")
            allocation._status = _Status.RELEASING
        try:
            backend_release()
        except Exception as exc:
            with self._lock:
                allocation._status = _Status.COMMITTED
                allocation._pinned = True
                self._counters["failed_releases"] += 1
                self._counters["backend_cleanup_failures"] += 1
                if not allocation._orphaned:
                    allocation._orphaned = True
                    self._counters["orphaned_release_bytes"] += allocation.nbytes
                self._counters["backend_cleanup_latched"] = 1
            _log.warning("backend release failed for allocation %s", allocation.id, exc_info=True)
            raise unavailable(
                "backend cleanup could not be confirmed; the allocation remains accounted", retryable=False
            ) from exc
        except BaseException:
            with self._lock:
                allocation._status = _Status.COMMITTED
            raise
        with self._lock:
            allocation._status = _Status.RELEASED
            self._allocations.pop(allocation.id, None)
            self._pools[self._pool_of(allocation.tier)].managed -= allocation.nbytes
            if allocation._orphaned:
                allocation._orphaned = False
                self._counters["orphaned_release_bytes"] -= allocation.nbytes

    # ------------------------------------------------------------------ relief

    def _cooling_down_locked(self) -> bool:
        return self._last_action_mono is not None and self._clock() - self._last_action_mono < self._cooldown_s

    def _relieve(self, tier: MemoryTier, nbytes: int, denied: _Denied, relief: ReliefExecutor) -> bool:
        """One bounded relief pass; True when at least one action was attempted."""
        with self._lock:
            if self._counters["backend_cleanup_latched"] or self._relief_running or self._cooling_down_locked():
                return False
            self._relief_running = True
        try:
            try:
                raw = list(relief.relief_candidates(tier))
            except Exception:
                _log.warning("relief candidate listing failed", exc_info=True)
                return False
            pool = self._pool_of(tier)
            pinned = self.pinned_state_ids()
            candidates: list[ReliefCandidate] = []
            by_id: dict[str, ReliefCandidate] = {}
            for cand in raw:
                if not isinstance(cand, ReliefCandidate) or cand.tier not in tuple(MemoryTier):
                    continue
                if self._pool_of(MemoryTier(cand.tier)) is not pool:
                    continue
                if cand.state_id in pinned and not cand.pinned:
                    cand = replace(cand, pinned=True)
                candidates.append(cand)
                by_id.setdefault(cand.state_id, cand)
            plan = plan_relief(candidates, nbytes, denied.capacity, denied.used, self._thresholds, self._max_actions)
            if not plan.feasible or not plan.actions:
                return False
            attempted = False
            for action in plan.actions:
                with self._lock:
                    if self._counters["backend_cleanup_latched"]:
                        break
                    self._counters["pressure_actions_in_flight"] += 1
                attempted = True
                ok = False
                try:
                    target = by_id[action.state_id]
                    if action.kind is ReliefKind.DEMOTE:
                        relief.demote(target)
                    else:
                        relief.evict(target)
                    ok = True
                except Exception:
                    _log.warning("relief %s failed", action.kind.value, exc_info=True)
                finally:
                    with self._lock:
                        self._counters["pressure_actions_in_flight"] -= 1
                        self._last_action_mono = self._clock()
                        self._last_action_unix_ms = int(self._wall() * 1000)
                        if ok:
                            key = "completed_demotions" if action.kind is ReliefKind.DEMOTE else "completed_evictions"
                            self._counters[key] += 1
                if not ok:
                    break
            return attempted
        finally:
            with self._lock:
                self._relief_running = False

    # ------------------------------------------------------------------ capability evidence

    def _evidence(self, pool: MemoryTier, label: str, max_age_s: float) -> CapabilityEvidence:
        with self._lock:
            obs = self._obs.get(pool)
            stale = obs is None or self._clock() - obs.at >= max_age_s
        if stale:
            self._observe(pool)
            with self._lock:
                obs = self._obs.get(pool)
        assert obs is not None
        if obs.sample is not None:
            return "supported", f"{label} memory sampled ({obs.sample.source})"
        if obs.failed:
            return "unavailable", f"the latest {label} memory sample failed"
        reason = getattr(self._source(pool), "absent_reason", None)
        if isinstance(reason, str) and reason:
            return "unavailable", reason
        return "unavailable", f"{label} memory is not observable on this host"

    def host_telemetry_status(self, *, max_age_s: float = 2.0) -> CapabilityEvidence:
        """``runtime.memory.telemetry.host``: ``supported`` iff the latest sample (fresh
        when older than ``max_age_s``) succeeded; returns ``(status, detail)``."""
        return self._evidence(MemoryTier.HOST, "host", max_age_s)

    def accelerator_telemetry_status(self, *, max_age_s: float = 2.0) -> CapabilityEvidence:
        """``runtime.memory.telemetry.accelerator``; on unified topology it is the shared pool."""
        if self._unified:
            status, detail = self._evidence(MemoryTier.HOST, "unified", max_age_s)
            return status, detail
        return self._evidence(MemoryTier.ACCELERATOR, "accelerator", max_age_s)

    def reservations_status(
        self, adapter_supplies_bound: bool, tier: MemoryTier = MemoryTier.HOST
    ) -> CapabilityEvidence:
        """``runtime.memory.reservations``: ``supported`` only when an adapter supplies a
        positive bounded requirement, ``tier`` telemetry works and the latch is clear."""
        if not adapter_supplies_bound:
            return (
                "unavailable",
                "no adapter supplies a positive bounded memory requirement before load, restore or decode",
            )
        if self.cleanup_latched:
            return "unavailable", "backend cleanup could not be confirmed; mutation is latched"
        status, _ = (
            self.host_telemetry_status()
            if self._pool_of(tier) is MemoryTier.HOST
            else self.accelerator_telemetry_status()
        )
        if status != "supported":
            return "unavailable", f"{tier.value} memory telemetry is unavailable"
        return "supported", f"admission control on projected {tier.value} memory utilization"

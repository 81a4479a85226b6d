"""Capability discovery: every protocol capability id (docs/protocol.md), each status computed from evidence.

Per request, the active adapter's own ``werk_capabilities`` report and the host's evidence
(memory telemetry; reservations, from the adapter's declared memory requirement) are asked once:
both can change within a backend process's life (a probe runs, a bound is supplied), and a
status must follow its evidence at once. The backend's resolved plan (``runtime.placement``,
which may cost a request to the backend) is kept for :data:`EVIDENCE_TTL_S` seconds per adapter
process identity (:meth:`werk_host.backend.Adapter.identity`) and instance: a restarted or
replaced backend process is a new identity, so its plan is asked afresh at once. The listing's
protocol objects are rebuilt only when a report changed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

from werk_host.backend import Adapter, CapabilityReport
from werk_host.deployments.instances import Instance
from werk_host.hooks import BackendHooks
from werk_host.protocol import CAPABILITY_OPERATIONS, Capability, CapabilityId, CapabilityStatus

HostEvidence = Callable[[], dict[CapabilityId, CapabilityReport]]

#: How long a backend process's placement report is reused (seconds).
EVIDENCE_TTL_S = 1.0
_MAX_KEYS = 64
#: (adapter identity, instance id): whose evidence a cache entry holds.
_Key = tuple[str, str | None]
V = TypeVar("V")


class _Timed(Generic[V]):
    """Values per key, each reused until ``ttl_s`` after it was computed (thread-safe)."""

    def __init__(self, ttl_s: float) -> None:
        self._ttl_s = ttl_s
        self._values: dict[_Key, tuple[float, V]] = {}
        self._lock = threading.Lock()

    def get(self, key: _Key, compute: Callable[[], V]) -> V:
        now = time.monotonic()
        with self._lock:
            hit = self._values.get(key)
        if hit is not None and now - hit[0] < self._ttl_s:
            return hit[1]
        value = compute()
        with self._lock:
            if len(self._values) >= _MAX_KEYS:
                self._values.clear()
            self._values[key] = (now, value)
        return value


def _merged(
    cap_id: CapabilityId,
    host: dict[CapabilityId, CapabilityReport],
    backend: dict[CapabilityId, CapabilityReport],
    adapter: Adapter | None,
    instance: Instance | None,
) -> CapabilityReport:
    """One id's report: the host's evidence first, then the backend's, else why there is none."""
    if cap_id in host:
        return host[cap_id]
    if cap_id in backend:
        return backend[cap_id]
    if cap_id is CapabilityId.RESERVATIONS:
        return CapabilityReport(
            CapabilityStatus.UNAVAILABLE,
            "no active adapter supplies a positive bounded memory requirement before load, restore or decode",
        )
    if adapter is None and instance is not None:
        return CapabilityReport(CapabilityStatus.UNSUPPORTED, f"not declared by backend {instance.backend}")
    if adapter is None:
        return CapabilityReport(CapabilityStatus.UNSUPPORTED, "no backend adapter is active")
    return CapabilityReport(CapabilityStatus.UNSUPPORTED, f"not implemented by backend {adapter.backend}")


class CapabilityResolver:
    """Merges host evidence with the active adapter's ``werk_capabilities`` report."""

    def __init__(self, hooks: BackendHooks, host_evidence: HostEvidence, *, ttl_s: float | None = None) -> None:
        self._hooks = hooks
        self._host_evidence = host_evidence
        self._placements: _Timed[CapabilityReport] = _Timed(EVIDENCE_TTL_S if ttl_s is None else ttl_s)
        self._listing: tuple[tuple[object, ...], list[Capability]] | None = None

    def reports(
        self, adapter: Adapter | None, instance: Instance | None = None
    ) -> dict[CapabilityId, CapabilityReport]:
        """Every capability id's report for ``adapter`` (the selected instance's, when ready).

        A deployed instance that is not ready (cold, starting, failed) reports the ids its
        backend declares as ``unavailable`` (residency included) with the reason, and the rest
        ``unsupported``; operations start it first, so only discovery sees these."""
        backend = self._backend(adapter, instance, placement=True)
        host = self._host_evidence()
        return {cap_id: _merged(cap_id, host, backend, adapter, instance) for cap_id in CAPABILITY_OPERATIONS}

    def _backend(
        self, adapter: Adapter | None, instance: Instance | None, *, placement: bool
    ) -> dict[CapabilityId, CapabilityReport]:
        """The backend's side of the reports. ``runtime.placement`` asks the backend for its plan,
        which may cost a request to it (kept per :data:`EVIDENCE_TTL_S`); with ``placement=False``
        (a gate on another id) that one report is left as not implemented."""
        if adapter is None:
            return self._not_ready(instance) if instance is not None else {}
        backend = self._hooks.capabilities(adapter) or {}
        if placement and CapabilityId.PLACEMENT not in backend:
            key = (adapter.identity(), instance.id if instance is not None else None)
            backend[CapabilityId.PLACEMENT] = self._placements.get(key, lambda: self._placement(adapter))
        return backend

    def _placement(self, adapter: Adapter) -> CapabilityReport:
        if self._hooks.deployment_plan(adapter) is not None:
            return CapabilityReport(CapabilityStatus.SUPPORTED, "the running backend reports its resolved plan")
        return CapabilityReport(CapabilityStatus.UNSUPPORTED, f"backend {adapter.backend} reports no resolved plan")

    @staticmethod
    def _not_ready(instance: Instance) -> dict[CapabilityId, CapabilityReport]:
        view = instance.view()
        why = view.error or f"instance {instance.id} is {view.state.value}; a request that uses it starts it"
        declared = {*instance.factory.capabilities, CapabilityId.MODEL_RESIDENCY}
        return {cap_id: CapabilityReport(CapabilityStatus.UNAVAILABLE, why) for cap_id in declared}

    def one(self, adapter: Adapter | None, cap_id: CapabilityId, instance: Instance | None = None) -> CapabilityReport:
        """``reports(...)[cap_id]``, computing only that report (every gate asks one)."""
        backend = self._backend(adapter, instance, placement=cap_id is CapabilityId.PLACEMENT)
        return _merged(cap_id, self._host_evidence(), backend, adapter, instance)

    def listing(self, adapter: Adapter | None, instance: Instance | None = None) -> list[Capability]:
        """Every capability as a protocol object (rebuilt only when a report changed)."""
        reports = self.reports(adapter, instance)
        key = tuple((cap_id, r.status, r.detail, r.operations) for cap_id, r in reports.items())
        last = self._listing
        if last is not None and last[0] == key:
            return list(last[1])
        built = [
            Capability(
                id=cap_id,
                status=report.status,
                detail=report.detail,
                operations=list(report.operations or CAPABILITY_OPERATIONS[cap_id]),
            )
            for cap_id, report in reports.items()
        ]
        self._listing = (key, built)
        return list(built)

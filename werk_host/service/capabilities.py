"""Capability discovery: every protocol capability id (docs/protocol.md), each status computed from evidence.

Evidence is cached per (adapter process identity, instance) in the service's one cache layer
(:mod:`werk_host.service.cache`), under an explicit stamp
(:meth:`CapabilityResolver.evidence_key`): the adapter's own ``werk_capabilities`` report, the
host's evidence (memory telemetry; reservations, from the adapter's declared memory
requirement) and the backend's resolved plan (``runtime.placement``, which may cost a request
to the backend). A report changes through what the backend does or with time, so an entry is
dropped as soon as

* the backend process changes (a restarted or replaced process is a new identity),
* any operation hook that may change a backend's evidence returned or raised
  (:meth:`werk_host.pluginhost.PluginHost.operations`: an opted-in prefill that ran the
  functional probe is visible to the very next request), or
* its :data:`EVIDENCE_TTL_S` window is over (a process that died on its own, a telemetry
  sample): evidence is never older than the TTL.

An instance that is not ready is never cached (its state moves on its own). The listing's
protocol objects are built once per entry and handed out as the same
:class:`~werk_host.service.cache.Shared` tuple, whose JSON text is made once too.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from werk_host.deployments.instances import Instance
from werk_host.hooks import BackendHooks
from werk_host.protocol import CAPABILITY_OPERATIONS, Capability, CapabilityId, CapabilityStatus
from werk_host.seam import Adapter, CapabilityReport
from werk_host.service.cache import Shared, StampedCache

#: The host's own evidence for the request's adapter (``None``: not ready) on its instance.
HostEvidence = Callable[[Adapter | None, Instance | None], dict[CapabilityId, CapabilityReport]]

#: How long an adapter's evidence is reused at most (seconds).
EVIDENCE_TTL_S = 1.0
_MAX_KEYS = 64
#: (adapter identity, instance id): whose evidence a cache entry holds.
_Key = tuple[str, str | None]


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


#: What a cache entry of evidence is kept under (:meth:`CapabilityResolver.evidence_key`): the
#: adapter's process identity, the operation count and the evidence TTL window.
EvidenceKey = tuple[str, int, int]


@dataclass
class _Evidence:
    """One adapter's cached evidence (module docstring): every id's report but the placement
    one, which is kept on its own, and the listing built from them once asked."""

    reports: dict[CapabilityId, CapabilityReport]
    listing: tuple[Shared[tuple[Capability, ...]], CapabilityReport] | None = None  # (listing, its placement)


class CapabilityResolver:
    """Merges host evidence with the active adapter's ``werk_capabilities`` report."""

    def __init__(self, hooks: BackendHooks, host_evidence: HostEvidence, *, ttl_s: float | None = None) -> None:
        self._hooks = hooks
        self._host_evidence = host_evidence
        self._ttl_s = EVIDENCE_TTL_S if ttl_s is None else ttl_s
        #: (identity, instance id) -> the backend's plan report, under the TTL window
        self._placements: StampedCache[_Key, CapabilityReport] = StampedCache(_MAX_KEYS)
        #: (identity, instance id) -> its evidence, under :meth:`evidence_key`
        self._entries: StampedCache[_Key, _Evidence] = StampedCache(_MAX_KEYS)

    def _window(self) -> int:
        """The :data:`EVIDENCE_TTL_S` window now (every call its own without a TTL)."""
        return int(time.monotonic() // self._ttl_s) if self._ttl_s > 0 else time.monotonic_ns()

    def evidence_key(self, adapter: Adapter) -> EvidenceKey:
        """What evidence about ``adapter`` is kept under (here and by the state listing, in
        :mod:`werk_host.service.cache`): the process identity, the operation count
        (:meth:`werk_host.pluginhost.PluginHost.operations`) and the TTL window now. It moves when
        the process changes, after any operation hook, and at the latest one TTL later."""
        return adapter.identity(), self._hooks.operations(), self._window()

    def _evidence(self, adapter: Adapter | None, instance: Instance | None) -> tuple[_Evidence, _Key | None]:
        """The cached evidence of ``adapter`` (module docstring), computed afresh when stale, and
        its key (``None`` without an adapter: nothing cached)."""
        stamp = self.evidence_key(adapter) if adapter is not None else None
        key = (stamp[0], instance.id if instance is not None else None) if stamp is not None else None
        if key is not None:
            hit = self._entries.get(key, stamp)
            if hit is not None:
                return hit, key
        if adapter is None:
            backend = self._not_ready(instance) if instance is not None else {}
        else:
            backend = dict(self._hooks.capabilities(adapter) or {})
        host = self._host_evidence(adapter, instance)
        entry = _Evidence(
            {
                cap_id: _merged(cap_id, host, backend, adapter, instance)
                for cap_id in CAPABILITY_OPERATIONS
                if cap_id is not CapabilityId.PLACEMENT or cap_id in host or cap_id in backend or adapter is None
            },
        )
        if key is not None:
            self._entries.put(key, stamp, entry)
        return entry, key

    def _placement_of(self, adapter: Adapter | None, key: _Key | None, entry: _Evidence) -> CapabilityReport:
        """``runtime.placement``: the entry's own report if the host or backend gave one, else
        the backend's plan, kept per :data:`EVIDENCE_TTL_S` (it may cost a request to the backend)."""
        found = entry.reports.get(CapabilityId.PLACEMENT)
        if found is not None:
            return found
        assert adapter is not None and key is not None  # without an adapter _evidence merged it
        return self._placements.get_or_make(key, self._window(), lambda: self._placement(adapter))

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
        """``reports(...)[cap_id]``; a gate on any other id never asks for the backend's plan."""
        if adapter is not None and cap_id is not CapabilityId.PLACEMENT:  # a gate: the entry kept under its stamp
            stamp = self.evidence_key(adapter)
            hit = self._entries.get((stamp[0], instance.id if instance is not None else None), stamp)
            if hit is not None:
                return hit.reports[cap_id]
        entry, key = self._evidence(adapter, instance)
        if cap_id is CapabilityId.PLACEMENT:
            return self._placement_of(adapter, key, entry)
        return entry.reports[cap_id]

    def listing(self, adapter: Adapter | None, instance: Instance | None = None) -> Shared[tuple[Capability, ...]]:
        """Every capability as a protocol object: the same :class:`Shared` immutable tuple while
        the evidence entry (its stamp) and the placement report are unchanged.

        A deployed instance that is not ready (cold, starting, failed) reports the ids its
        backend declares as ``unavailable`` (residency included) with the reason, and the rest
        ``unsupported``; operations start it first, so only discovery sees these."""
        entry, key = self._evidence(adapter, instance)
        placement = self._placement_of(adapter, key, entry)
        built = entry.listing
        if built is not None and built[1] == placement:
            return built[0]
        listing = Shared(
            tuple(
                Capability(
                    id=cap_id,
                    status=report.status,
                    detail=report.detail,
                    operations=list(report.operations or CAPABILITY_OPERATIONS[cap_id]),
                )
                for cap_id, report in ((c, entry.reports.get(c, placement)) for c in CAPABILITY_OPERATIONS)
            )
        )
        entry.listing = (listing, placement)
        return listing

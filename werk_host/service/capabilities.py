"""Capability discovery: every protocol capability id (docs/protocol.md), each status computed from evidence now."""

from __future__ import annotations

from collections.abc import Callable

from werk_host.backend import Adapter, CapabilityReport
from werk_host.hooks import BackendHooks
from werk_host.protocol import CAPABILITY_OPERATIONS, Capability, CapabilityId, CapabilityStatus

HostEvidence = Callable[[], dict[CapabilityId, CapabilityReport]]


class CapabilityResolver:
    """Merges host evidence with the active adapter's ``werk_capabilities`` report."""

    def __init__(self, hooks: BackendHooks, host_evidence: HostEvidence) -> None:
        self._hooks = hooks
        self._host_evidence = host_evidence

    def reports(self, adapter: Adapter | None) -> dict[CapabilityId, CapabilityReport]:
        backend: dict[CapabilityId, CapabilityReport] = {}
        if adapter is not None:
            backend = self._hooks.capabilities(adapter) or {}
        host = self._host_evidence()
        merged: dict[CapabilityId, CapabilityReport] = {}
        for cap_id in CAPABILITY_OPERATIONS:
            if cap_id in host:
                merged[cap_id] = host[cap_id]
            elif cap_id in backend:
                merged[cap_id] = backend[cap_id]
            elif cap_id is CapabilityId.RESERVATIONS:
                merged[cap_id] = CapabilityReport(
                    CapabilityStatus.UNAVAILABLE,
                    "no active adapter supplies a positive bounded memory requirement before load, restore or decode",
                )
            elif adapter is None:
                merged[cap_id] = CapabilityReport(CapabilityStatus.UNSUPPORTED, "no backend adapter is active")
            else:
                merged[cap_id] = CapabilityReport(
                    CapabilityStatus.UNSUPPORTED, f"not implemented by backend {adapter.backend}"
                )
        return merged

    def one(self, adapter: Adapter | None, cap_id: CapabilityId) -> CapabilityReport:
        return self.reports(adapter)[cap_id]

    def listing(self, adapter: Adapter | None) -> list[Capability]:
        return [
            Capability(
                id=cap_id,
                status=report.status,
                detail=report.detail,
                operations=list(report.operations or CAPABILITY_OPERATIONS[cap_id]),
            )
            for cap_id, report in self.reports(adapter).items()
        ]

"""Capability discovery: every protocol capability id (docs/protocol.md), each status computed from evidence now."""

from __future__ import annotations

from collections.abc import Callable

from werk_host.backend import Adapter, CapabilityReport
from werk_host.deployments.instances import Instance
from werk_host.hooks import BackendHooks
from werk_host.protocol import CAPABILITY_OPERATIONS, Capability, CapabilityId, CapabilityStatus

HostEvidence = Callable[[], dict[CapabilityId, CapabilityReport]]


class CapabilityResolver:
    """Merges host evidence with the active adapter's ``werk_capabilities`` report."""

    def __init__(self, hooks: BackendHooks, host_evidence: HostEvidence) -> None:
        self._hooks = hooks
        self._host_evidence = host_evidence

    def reports(
        self, adapter: Adapter | None, instance: Instance | None = None, *, placement: bool = True
    ) -> dict[CapabilityId, CapabilityReport]:
        """Every capability id's report for ``adapter`` (the selected instance's, when ready).

        ``runtime.placement`` asks the backend for its plan, which may cost a request to it; with
        ``placement=False`` (a gate on another id) that one report is left as not implemented.
        A deployed instance that is not ready (cold, starting, failed) reports the ids its
        backend declares as ``unavailable`` (residency included) with the reason, and the rest
        ``unsupported``; operations start it first, so only discovery sees these."""
        backend: dict[CapabilityId, CapabilityReport] = {}
        if adapter is not None:
            backend = self._hooks.capabilities(adapter) or {}
            if placement and CapabilityId.PLACEMENT not in backend:
                backend[CapabilityId.PLACEMENT] = self._placement(adapter)
        elif instance is not None:
            backend = self._not_ready(instance)
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
            elif adapter is None and instance is not None:
                merged[cap_id] = CapabilityReport(
                    CapabilityStatus.UNSUPPORTED, f"not declared by backend {instance.backend}"
                )
            elif adapter is None:
                merged[cap_id] = CapabilityReport(CapabilityStatus.UNSUPPORTED, "no backend adapter is active")
            else:
                merged[cap_id] = CapabilityReport(
                    CapabilityStatus.UNSUPPORTED, f"not implemented by backend {adapter.backend}"
                )
        return merged

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
        return self.reports(adapter, instance, placement=cap_id is CapabilityId.PLACEMENT)[cap_id]

    def listing(self, adapter: Adapter | None, instance: Instance | None = None) -> list[Capability]:
        return [
            Capability(
                id=cap_id,
                status=report.status,
                detail=report.detail,
                operations=list(report.operations or CAPABILITY_OPERATIONS[cap_id]),
            )
            for cap_id, report in self.reports(adapter, instance).items()
        ]

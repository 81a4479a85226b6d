"""Memory accounting: telemetry sources, pressure classes, reservations and bounded relief.

See :mod:`werk_host.memory.manager` for the accounting model. Nothing here talks
HTTP; ``MemoryManager.report()`` is the ``/werk/v1/memory`` data document.
"""

from __future__ import annotations

from werk_host.memory.base import (
    DEFAULT_THRESHOLDS,
    MemorySample,
    MemoryTier,
    Pressure,
    TelemetryError,
    Thresholds,
    Topology,
    classify_pressure,
    worst_pressure,
)
from werk_host.memory.manager import (
    COUNTER_NAMES,
    Allocation,
    CapabilityEvidence,
    MemoryManager,
    MemoryReservation,
)
from werk_host.memory.relief import (
    ReliefAction,
    ReliefCandidate,
    ReliefExecutor,
    ReliefKind,
    ReliefPlan,
    max_used_below_hard,
    plan_relief,
)
from werk_host.memory.telemetry import (
    CgroupLevel,
    HostMemorySource,
    NvmlAcceleratorSource,
    TelemetrySource,
    TopologySource,
    detect_topology,
    is_apple_silicon,
    read_cgroup_memory,
)

__all__ = [
    "COUNTER_NAMES",
    "DEFAULT_THRESHOLDS",
    "Allocation",
    "CapabilityEvidence",
    "CgroupLevel",
    "HostMemorySource",
    "MemoryManager",
    "MemoryReservation",
    "MemorySample",
    "MemoryTier",
    "NvmlAcceleratorSource",
    "Pressure",
    "ReliefAction",
    "ReliefCandidate",
    "ReliefExecutor",
    "ReliefKind",
    "ReliefPlan",
    "TelemetryError",
    "TelemetrySource",
    "Thresholds",
    "Topology",
    "TopologySource",
    "classify_pressure",
    "detect_topology",
    "is_apple_silicon",
    "max_used_below_hard",
    "plan_relief",
    "read_cgroup_memory",
    "worst_pressure",
]

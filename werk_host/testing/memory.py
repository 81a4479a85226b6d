"""Memory telemetry a test sets: the host's :class:`~werk_host.memory.MemoryManager` over pools
whose capacity and availability the test chooses (and may change while the host runs).

``werk_host.memory`` reads telemetry through :class:`~werk_host.memory.TelemetrySource`;
:class:`SnapshotPool` is one that reports the snapshot it holds. The host pool is the real
:class:`~werk_host.memory.HostMemorySource` reading the snapshot instead of psutil, so its
cgroup-free path is the one ``werk serve`` runs::

    host_pool, gpu = SnapshotPool(16 << 30, 14 << 30), SnapshotPool(24 << 30, 20 << 30)
    memory = snapshot_memory(host_pool, gpu)
    host = make_host(home, plugin=plugin, memory=memory)

:data:`OVERHEAD_BYTES` is what the host adds to a backend's ``MemoryEstimate`` and the model
files (docs/deployments.md, "Memory estimate").
"""

from __future__ import annotations

from collections.abc import Callable

from werk_host.deployments.footprint import OVERHEAD_BYTES
from werk_host.memory import HostMemorySource, MemoryManager, MemorySample, Topology

__all__ = ["OVERHEAD_BYTES", "SnapshotPool", "snapshot_memory"]


class SnapshotPool:
    """A memory pool reporting ``capacity`` bytes, of which ``available`` less what ``held()``
    says is taken now (e.g. by the instances a test has loaded) are available: a
    ``TelemetrySource`` of a discrete accelerator, or the host's figures for
    :func:`snapshot_memory`. Both may be changed while the host runs."""

    def __init__(self, capacity: int, available: int, held: Callable[[], int] = lambda: 0) -> None:
        self.capacity = capacity
        self.available = available
        self.held = held

    def sample(self) -> MemorySample:
        return MemorySample(self.capacity, self.now(), "snapshot")

    def now(self) -> int:
        return min(max(self.available - self.held(), 0), self.capacity)

    def topology(self) -> Topology:
        return Topology.DISCRETE


def snapshot_memory(host: SnapshotPool, accelerator: SnapshotPool | None = None) -> MemoryManager:
    """A memory manager whose host pool is ``host`` (through :class:`HostMemorySource`, without
    cgroups) and whose accelerator is ``accelerator`` (``None``: no accelerator observable)."""
    source = HostMemorySource(virtual_memory=lambda: (host.capacity, host.now()), use_cgroup=False)
    return MemoryManager(source, accelerator, topology=Topology.DISCRETE)

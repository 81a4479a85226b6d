"""The memory an instance needs loaded, and the memory there is (docs/deployments.md, "Memory
estimate").

:func:`estimate` is the figure before an instance's first start: the profile's ``memory`` when
it declares one; otherwise the model files' size, plus the KV cache the backend expects for the
configured context (``AdapterFactory.memory_estimate``, a
:class:`~werk_host.seam.MemoryEstimate`), plus :data:`OVERHEAD_BYTES`. The backend's
``accelerator_share`` of the weights and KV cache is needed in accelerator memory, the rest (and
the overhead) in host memory. :func:`measured` replaces the host part once the instance has run:
the most resident memory its processes were seen to hold, never less than the model files' host
share (a memory-mapped model may not be paged in yet when it is sampled).

:func:`available` reads the host's :class:`~werk_host.memory.MemoryManager` (``werk_host/memory``:
host memory within cgroup limits, accelerator memory through NVML); on a unified topology the
accelerator is host memory, so its part is counted there.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Final

from werk_host.deployments.instances import Instance
from werk_host.memory import MemoryManager
from werk_host.seam import MemoryEstimate

log = logging.getLogger(__name__)

#: What an instance needs beyond its model files and KV cache: the backend process itself and
#: its compute buffers (docs/deployments.md, "Memory estimate").
OVERHEAD_BYTES: Final = 256 << 20


def mib(nbytes: int) -> str:
    return f"{max(nbytes, 0) >> 20} MiB"


@dataclass(frozen=True)
class Footprint:
    """Bytes an instance needs loaded: ``host`` and ``accelerator``, and how that was found."""

    host: int
    accelerator: int = 0
    #: the parts, for a refusal's reason: "model files 138 MiB + KV cache 360 MiB (16384 tokens) ..."
    detail: str = ""

    @property
    def total(self) -> int:
        return self.host + self.accelerator

    def __add__(self, other: Footprint) -> Footprint:
        return Footprint(self.host + other.host, self.accelerator + other.accelerator)


NONE: Final = Footprint(0)


def estimate(instance: Instance) -> Footprint:
    """The need of ``instance`` before it has run (module docstring)."""
    spec = instance.spec
    if spec.endpoint is not None:
        return NONE
    backend = _backend_estimate(instance)
    share = backend.accelerator_share if backend is not None else 0.0
    if spec.memory_bytes is not None:
        on_accelerator = round(spec.memory_bytes * share)
        return Footprint(spec.memory_bytes - on_accelerator, on_accelerator, f"memory {mib(spec.memory_bytes)}")
    weights = sum(f.bytes for f in instance.manifest.files)
    kv = backend.kv_bytes if backend is not None else 0
    parts = [f"model files {mib(weights)}"]
    if backend is not None:
        tokens = f" for {backend.context_tokens} tokens" if backend.context_tokens is not None else ""
        parts.append(f"KV cache {mib(kv)}{tokens}")
    parts.append(f"overhead {mib(OVERHEAD_BYTES)}")
    on_accelerator = round((weights + kv) * share)
    detail = " + ".join(parts) + (f", {share:.0%} on the accelerator" if share else "")
    return Footprint(weights + kv - on_accelerator + OVERHEAD_BYTES, on_accelerator, detail)


def measured(instance: Instance, before: Footprint, resident: int) -> Footprint:
    """``before`` with its host part replaced by ``resident`` bytes seen held by the instance's
    processes, never below the model files' host share."""
    if instance.spec.memory_bytes is not None or instance.spec.endpoint is not None:
        return before
    weights = sum(f.bytes for f in instance.manifest.files)
    share = 1.0 - before.accelerator / max(before.total, 1)
    host = max(resident, round(weights * share))
    return Footprint(host, before.accelerator, f"{mib(resident)} resident when it last ran")


def _backend_estimate(instance: Instance) -> MemoryEstimate | None:
    hook = instance.factory.memory_estimate
    if hook is None:
        return None
    try:
        found = hook(instance.config, instance.manifest)
    except Exception:  # a backend's estimate is advice: without it the model files count alone
        log.warning("instance %s: the backend's memory estimate failed", instance.id, exc_info=True)
        return None
    if found is not None and not isinstance(found, MemoryEstimate):
        log.warning("instance %s: the backend's memory estimate is not a MemoryEstimate", instance.id)
        return None
    return found


@dataclass(frozen=True)
class Available:
    """Memory available now: ``None`` where a pool is not observable."""

    host: int | None
    accelerator: int | None
    unified: bool = False

    def fold(self, need: Footprint) -> Footprint:
        """``need`` as this topology pools it (unified: all of it host memory)."""
        return Footprint(need.total, 0, need.detail) if self.unified else need


def available(manager: MemoryManager) -> Available:
    """What ``manager``'s telemetry sees available now."""
    report = manager.report()
    return Available(
        report["host"]["available_bytes"],
        None if manager.unified else report["accelerator"]["available_bytes"],
        manager.unified,
    )

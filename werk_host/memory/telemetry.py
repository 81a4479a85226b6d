"""Injectable memory telemetry sources.

Contract of a :class:`TelemetrySource`: ``sample()`` returns a
:class:`MemorySample`, returns ``None`` when the pool is not observable on this
host (no driver, no device, metric not supported: *unknown*, not an error), or
raises when an observation was attempted and failed. Values are never guessed.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import importlib.util
import os
import platform
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from werk_host.memory.base import MemorySample, TelemetryError, Topology

#: cgroup v1 reports "no limit" as PAGE_COUNTER_MAX * page size (about 2**63);
#: anything at or above 2**62 is treated as unlimited.
_V1_UNLIMITED = 1 << 62


@runtime_checkable
class TelemetrySource(Protocol):
    """A memory pool observer (see the module docstring for the contract)."""

    def sample(self) -> MemorySample | None: ...


@runtime_checkable
class TopologySource(Protocol):
    """An accelerator source that can also say how it is attached."""

    def topology(self) -> Topology: ...


# --------------------------------------------------------------------------- cgroups


@dataclass(frozen=True, slots=True)
class CgroupLevel:
    """A cgroup level with a finite memory limit.

    ``reclaimable_bytes`` is the kernel's inactive file cache of the group (0
    when not reported); it is subtracted from usage as container runtimes do.
    """

    version: int
    limit_bytes: int
    usage_bytes: int
    reclaimable_bytes: int

    @property
    def headroom_bytes(self) -> int:
        working_set = max(0, self.usage_bytes - self.reclaimable_bytes)
        return max(0, self.limit_bytes - working_set)


def _read_text(path: Path) -> str | None:
    """File text, ``None`` when it does not exist; other I/O errors raise TelemetryError."""
    try:
        return path.read_text(encoding="ascii", errors="strict")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeError) as exc:
        raise TelemetryError("cgroup memory file could not be read") from exc


def _parse_int(text: str) -> int:
    try:
        value = int(text.strip())
    except ValueError as exc:
        raise TelemetryError("cgroup memory file is malformed") from exc
    if value < 0:
        raise TelemetryError("cgroup memory file holds a negative value")
    return value


def _stat_value(stat_text: str | None, key: str) -> int:
    if stat_text is None:
        return 0
    for line in stat_text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == key:
            try:
                return max(0, int(parts[1]))
            except ValueError:
                return 0
    return 0


def _group_path(proc_self_cgroup: Path, version: int) -> str | None:
    """The process's group path for the v2 unified line or the v1 memory line."""
    text = _read_text(proc_self_cgroup)
    if text is None:
        return None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if version == 2 and hierarchy == "0" and controllers == "":
            return path
        if version == 1 and "memory" in controllers.split(","):
            return path
    return None


def _levels_from(mount: Path, rel: str | None) -> list[Path]:
    """Directories from the process's group up to the mount, innermost first.

    A path with ``..`` (a group outside this cgroup namespace) or one that is
    absent under the mount (the mount *is* the container's group) falls back to
    the mount alone.
    """
    parts = [p for p in (rel or "").split("/") if p]
    if any(p in (".", "..") for p in parts):
        parts = []
    group = mount.joinpath(*parts) if parts else mount
    if not group.is_dir():
        group, parts = mount, []
    levels = [group]
    for _ in parts:
        group = group.parent
        levels.append(group)
    return levels


def read_cgroup_memory(
    cgroup_root: str | os.PathLike[str] = "/sys/fs/cgroup",
    proc_self_cgroup: str | os.PathLike[str] = "/proc/self/cgroup",
) -> list[CgroupLevel]:
    """Every finite memory limit that applies to this process, innermost first.

    cgroup v2 is used when ``<root>/cgroup.controllers`` exists (``memory.max``,
    ``memory.current``); otherwise v1 under ``<root>/memory``
    (``memory.limit_in_bytes``, ``memory.usage_in_bytes``). An empty list means
    no limit applies. A present but unreadable or malformed file raises
    :class:`TelemetryError` rather than being ignored.
    """
    root = Path(cgroup_root)
    if (root / "cgroup.controllers").is_file():
        version, mount = 2, root
        limit_name, usage_name, reclaim_key = "memory.max", "memory.current", "inactive_file"
    elif (root / "memory").is_dir():
        version, mount = 1, root / "memory"
        limit_name, usage_name, reclaim_key = (
            "memory.limit_in_bytes",
            "memory.usage_in_bytes",
            "total_inactive_file",
        )
    else:
        return []
    out: list[CgroupLevel] = []
    for level in _levels_from(mount, _group_path(Path(proc_self_cgroup), version)):
        limit_text = _read_text(level / limit_name)
        if limit_text is None or limit_text.strip() == "max":
            continue
        limit = _parse_int(limit_text)
        if version == 1 and limit >= _V1_UNLIMITED:
            continue
        usage_text = _read_text(level / usage_name)
        if usage_text is None:
            raise TelemetryError("cgroup has a memory limit but no usage figure")
        out.append(
            CgroupLevel(
                version=version,
                limit_bytes=limit,
                usage_bytes=_parse_int(usage_text),
                reclaimable_bytes=_stat_value(_read_text(level / "memory.stat"), reclaim_key),
            )
        )
    return out


# --------------------------------------------------------------------------- host


def _psutil_virtual_memory() -> tuple[int, int]:
    # Imported by name so the module types cleanly with or without psutil stubs.
    psutil: Any = importlib.import_module("psutil")
    vm = psutil.virtual_memory()
    return int(vm.total), int(vm.available)


class HostMemorySource:
    """Host RAM from psutil, bounded by the process's cgroup memory limits.

    Capacity is ``min(physical total, every finite cgroup limit)``; availability
    is ``min(psutil available, limit - working set at every limited level,
    capacity)``. ``cgroup_root``, ``proc_self_cgroup`` and ``virtual_memory``
    (returns ``(total, available)``) are injectable for tests.
    """

    def __init__(
        self,
        *,
        cgroup_root: str | os.PathLike[str] = "/sys/fs/cgroup",
        proc_self_cgroup: str | os.PathLike[str] = "/proc/self/cgroup",
        virtual_memory: Callable[[], tuple[int, int]] | None = None,
        use_cgroup: bool | None = None,
    ) -> None:
        self._cgroup_root = Path(cgroup_root)
        self._proc_self_cgroup = Path(proc_self_cgroup)
        self._virtual_memory = virtual_memory or _psutil_virtual_memory
        self._use_cgroup = sys.platform.startswith("linux") if use_cgroup is None else use_cgroup

    def sample(self) -> MemorySample:
        """A fresh observation; raises :class:`TelemetryError` (or psutil's error) on failure."""
        total, available = self._virtual_memory()
        if total <= 0:
            raise TelemetryError("host reported no physical memory")
        capacity, avail = total, min(max(0, available), total)
        source = "psutil"
        levels = read_cgroup_memory(self._cgroup_root, self._proc_self_cgroup) if self._use_cgroup else []
        binding = [lv for lv in levels if lv.limit_bytes < total]
        if binding:
            capacity = min(lv.limit_bytes for lv in binding)
            avail = min([avail, capacity] + [lv.headroom_bytes for lv in binding])
            source = f"psutil+cgroup-v{binding[0].version}"
        if capacity <= 0:
            raise TelemetryError("cgroup memory limit is zero")
        return MemorySample(capacity_bytes=capacity, available_bytes=avail, source=source)


# --------------------------------------------------------------------------- NVML


#: Why NVML is not observable (:attr:`NvmlAcceleratorSource.absent_reason`).
NO_BINDING = "the NVML Python binding is not installed"
NO_DRIVER = "no NVIDIA driver (NVML could not be initialized)"
#: The library the NVML binding loads on Linux (elsewhere it searches the driver's own paths).
NVML_LIBRARY = "libnvidia-ml.so.1"


def _nvml_library_present() -> bool:
    """Whether NVIDIA's NVML library loads here; always ``True`` off Linux, where the binding's
    own search decides."""
    if not sys.platform.startswith("linux"):
        return True
    try:
        ctypes.CDLL(NVML_LIBRARY)
    except OSError:
        return False
    return True


class NvmlAcceleratorSource:
    """Accelerator memory summed over NVIDIA devices through NVML (``pynvml``).

    ``sample()`` returns ``None`` when the library or driver is missing, no
    device is present, or a device does not support memory queries (integrated
    GPUs); any other NVML failure raises :class:`TelemetryError`. Initialization
    is attempted once; an absent driver stays absent for this object's life.
    ``nvml`` may be injected (a module-like object) for tests.

    On Linux the driver's library is looked for (``dlopen`` of the name the binding
    itself loads) before the binding is imported: a machine without NVIDIA's driver
    does not pay the binding's ~15 ms import at every start (docs/operations.md,
    "Where the start-up time goes").
    """

    def __init__(self, nvml: Any | None = None) -> None:
        self._nvml: Any | None = nvml
        self._injected = nvml is not None
        self._lock = threading.Lock()
        self._initialized = False
        self._absent_reason: str | None = None
        self._topology = Topology.UNKNOWN
        self._determined = False

    @property
    def absent_reason(self) -> str | None:
        """Why the accelerator is not observable (public text), or ``None``."""
        return self._absent_reason

    def _init(self) -> Any | None:
        if self._initialized:
            return self._nvml
        if self._absent_reason is not None:
            return None
        if self._nvml is None:
            if importlib.util.find_spec("pynvml") is None:
                self._absent_reason = NO_BINDING
                return None
            if not _nvml_library_present():
                self._absent_reason = NO_DRIVER
                return None
            try:
                self._nvml = importlib.import_module("pynvml")
            except ImportError:
                self._absent_reason = NO_BINDING
                return None
        try:
            self._nvml.nvmlInit()
        except Exception:
            self._absent_reason = NO_DRIVER
            return None
        self._initialized = True
        return self._nvml

    def _not_supported(self, exc: BaseException) -> bool:
        nvml = self._nvml
        code = getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", 3)
        return getattr(exc, "value", None) == code

    def sample(self) -> MemorySample | None:
        with self._lock:
            nvml = self._init()
            if nvml is None:
                return None
            try:
                count = int(nvml.nvmlDeviceGetCount())
                if count <= 0:
                    self._topology, self._determined = Topology.UNKNOWN, True
                    return None
                total = free = 0
                for index in range(count):
                    handle = nvml.nvmlDeviceGetHandleByIndex(index)
                    info = nvml.nvmlDeviceGetMemoryInfo(handle)
                    total += int(info.total)
                    free += int(info.free)
            except Exception as exc:
                if self._not_supported(exc):
                    self._topology, self._determined = Topology.UNKNOWN, True
                    return None
                raise TelemetryError("NVML memory query failed") from exc
            self._topology, self._determined = Topology.DISCRETE, True
            return MemorySample(capacity_bytes=total, available_bytes=min(free, total), source="nvml")

    def topology(self) -> Topology:
        """``discrete`` once NVML has reported device memory, else ``unknown``."""
        if not self._determined:
            try:
                self.sample()
            except TelemetryError:
                return Topology.UNKNOWN
        return self._topology

    def close(self) -> None:
        """Shut NVML down if this object initialized it."""
        with self._lock:
            if self._initialized and self._nvml is not None:
                with contextlib.suppress(Exception):  # a failed shutdown changes nothing reported
                    self._nvml.nvmlShutdown()
                self._initialized = False


def is_apple_silicon() -> bool:
    """True on macOS arm64, whose GPU shares system memory."""
    return sys.platform == "darwin" and platform.machine() == "arm64"


def detect_topology(accelerator: TelemetrySource | None, *, unified: bool | None = None) -> Topology:
    """``unified`` when told or on Apple silicon; else what the accelerator source
    reports (``discrete`` only with NVML evidence); else ``unknown``."""
    if unified if unified is not None else is_apple_silicon():
        return Topology.UNIFIED
    if accelerator is not None and isinstance(accelerator, TopologySource):
        return accelerator.topology()
    return Topology.UNKNOWN

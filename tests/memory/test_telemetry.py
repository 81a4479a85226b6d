"""Telemetry sources: fabricated cgroup v1/v2 trees, a fake NVML, and this real host."""

from __future__ import annotations

import ctypes.util
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from werk_host.memory import (
    HostMemorySource,
    MemoryManager,
    NvmlAcceleratorSource,
    TelemetryError,
    Topology,
    detect_topology,
    read_cgroup_memory,
)

from .fakes import GIB, FakeClock

MIB = 1 << 20


def write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def vm(total: int, available: int) -> Callable[[], tuple[int, int]]:
    return lambda: (total, available)


# --------------------------------------------------------------------------- cgroup v2


@pytest.fixture
def v2(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    write(root, "cgroup.controllers", "cpuset cpu io memory pids\n")
    write(root, "user.slice/memory.max", f"{8 * GIB}\n")
    write(root, "user.slice/memory.current", f"{3 * GIB}\n")
    write(root, "user.slice/app.scope/memory.max", "max\n")
    write(root, "user.slice/app.scope/memory.current", f"{GIB}\n")
    proc = tmp_path / "proc_self_cgroup"
    proc.write_text("0::/user.slice/app.scope\n")
    return root, proc


def test_cgroup_v2_limit_is_the_capacity(v2: tuple[Path, Path]) -> None:
    root, proc = v2
    write(root, "user.slice/memory.stat", f"anon 12345\ninactive_file {GIB}\nactive_file 7\n")
    levels = read_cgroup_memory(root, proc)
    assert [(lv.version, lv.limit_bytes, lv.usage_bytes, lv.reclaimable_bytes) for lv in levels] == [
        (2, 8 * GIB, 3 * GIB, GIB)
    ]
    src = HostMemorySource(cgroup_root=root, proc_self_cgroup=proc, virtual_memory=vm(64 * GIB, 40 * GIB))
    s = src.sample()
    assert (s.capacity_bytes, s.available_bytes, s.source) == (8 * GIB, 6 * GIB, "psutil+cgroup-v2")


def test_cgroup_v2_nested_limits_take_the_tightest(v2: tuple[Path, Path]) -> None:
    root, proc = v2
    write(root, "user.slice/memory.current", f"{7 * GIB}\n")
    write(root, "user.slice/app.scope/memory.max", f"{4 * GIB}\n")
    src = HostMemorySource(cgroup_root=root, proc_self_cgroup=proc, virtual_memory=vm(64 * GIB, 40 * GIB))
    s = src.sample()
    # Capacity is the inner 4 GiB limit; the parent has only 1 GiB of headroom left.
    assert (s.capacity_bytes, s.available_bytes) == (4 * GIB, GIB)


def test_host_available_never_exceeds_psutil(v2: tuple[Path, Path]) -> None:
    root, proc = v2
    src = HostMemorySource(cgroup_root=root, proc_self_cgroup=proc, virtual_memory=vm(64 * GIB, 2 * GIB))
    assert src.sample().available_bytes == 2 * GIB


def test_limit_above_physical_memory_is_ignored(v2: tuple[Path, Path]) -> None:
    root, proc = v2
    write(root, "user.slice/memory.max", f"{128 * GIB}\n")
    src = HostMemorySource(cgroup_root=root, proc_self_cgroup=proc, virtual_memory=vm(64 * GIB, 40 * GIB))
    s = src.sample()
    assert (s.capacity_bytes, s.available_bytes, s.source) == (64 * GIB, 40 * GIB, "psutil")


def test_cgroup_namespace_root_is_the_group(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    write(root, "cgroup.controllers", "memory\n")
    write(root, "memory.max", f"{2 * GIB}\n")
    write(root, "memory.current", f"{512 * MIB}\n")
    for content in ("0::/\n", "0::/kubepods/pod1/ctr\n", "0::/../../elsewhere\n"):
        proc = tmp_path / "proc"
        proc.write_text(content)
        levels = read_cgroup_memory(root, proc)
        assert [(lv.limit_bytes, lv.usage_bytes) for lv in levels] == [(2 * GIB, 512 * MIB)], content
    assert read_cgroup_memory(root, tmp_path / "missing")[0].limit_bytes == 2 * GIB


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"user.slice/memory.max": "lots\n"}, "malformed"),
        ({"user.slice/memory.max": "-1\n"}, "negative"),
        ({"user.slice/memory.current": None}, "no usage"),
    ],
)
def test_malformed_cgroup_files_fail_the_sample(
    v2: tuple[Path, Path], files: dict[str, str | None], message: str
) -> None:
    root, proc = v2
    for rel, text in files.items():
        if text is None:
            (root / rel).unlink()
        else:
            write(root, rel, text)
    with pytest.raises(TelemetryError, match=message):
        read_cgroup_memory(root, proc)
    src = HostMemorySource(cgroup_root=root, proc_self_cgroup=proc, virtual_memory=vm(64 * GIB, 40 * GIB))
    mgr = MemoryManager(src, None, clock=FakeClock())
    snap = mgr.report()
    assert snap["host"]["capacity_bytes"] is None
    assert snap["counters"]["telemetry_errors"] == 1


# --------------------------------------------------------------------------- cgroup v1


@pytest.fixture
def v1(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    write(root, "unified/cgroup.controllers", "")  # hybrid layout: v2 mounted without memory
    write(root, "memory/memory.limit_in_bytes", "9223372036854771712\n")
    write(root, "memory/memory.usage_in_bytes", f"{20 * GIB}\n")
    write(root, "memory/docker/abc/memory.limit_in_bytes", f"{2 * GIB}\n")
    write(root, "memory/docker/abc/memory.usage_in_bytes", f"{768 * MIB}\n")
    write(root, "memory/docker/abc/memory.stat", f"cache 1\ninactive_file 5\ntotal_inactive_file {256 * MIB}\n")
    proc = tmp_path / "proc_self_cgroup"
    proc.write_text("12:pids:/docker/abc\n4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n0::/\n")
    return root, proc


def test_cgroup_v1_limit_is_the_capacity(v1: tuple[Path, Path]) -> None:
    root, proc = v1
    levels = read_cgroup_memory(root, proc)
    assert [(lv.version, lv.limit_bytes, lv.usage_bytes, lv.reclaimable_bytes) for lv in levels] == [
        (1, 2 * GIB, 768 * MIB, 256 * MIB)
    ]
    src = HostMemorySource(cgroup_root=root, proc_self_cgroup=proc, virtual_memory=vm(32 * GIB, 30 * GIB))
    s = src.sample()
    assert (s.capacity_bytes, s.available_bytes, s.source) == (
        2 * GIB,
        2 * GIB - 512 * MIB,
        "psutil+cgroup-v1",
    )


def test_cgroup_v1_unlimited_is_no_limit(v1: tuple[Path, Path]) -> None:
    root, proc = v1
    write(root, "memory/docker/abc/memory.limit_in_bytes", "9223372036854771712\n")
    assert read_cgroup_memory(root, proc) == []
    src = HostMemorySource(cgroup_root=root, proc_self_cgroup=proc, virtual_memory=vm(32 * GIB, 30 * GIB))
    assert src.sample().capacity_bytes == 32 * GIB


def test_no_cgroup_hierarchy_and_opt_out(tmp_path: Path) -> None:
    assert read_cgroup_memory(tmp_path, tmp_path / "none") == []
    src = HostMemorySource(cgroup_root="/nonexistent", use_cgroup=False, virtual_memory=vm(GIB, GIB))
    assert src.sample().source == "psutil"


def test_psutil_reporting_nothing_is_a_failure() -> None:
    with pytest.raises(TelemetryError):
        HostMemorySource(use_cgroup=False, virtual_memory=vm(0, 0)).sample()


# --------------------------------------------------------------------------- NVML (fake)


class FakeNvml:
    NVML_ERROR_NOT_SUPPORTED = 3

    class NVMLError(Exception):
        def __init__(self, value: int) -> None:
            super().__init__(value)
            self.value = value

    def __init__(self, devices: list[tuple[int, int]], *, init_error: bool = False) -> None:
        self.devices = devices
        self.init_error = init_error
        self.mem_error: int | None = None
        self.inits = 0
        self.shutdowns = 0

    def nvmlInit(self) -> None:
        self.inits += 1
        if self.init_error:
            raise self.NVMLError(9)  # driver not loaded

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        if self.mem_error is not None:
            raise self.NVMLError(self.mem_error)
        total, free = self.devices[handle]
        return SimpleNamespace(total=total, free=free, used=total - free)


def test_nvml_without_driver_is_unknown() -> None:
    nvml = FakeNvml([], init_error=True)
    src = NvmlAcceleratorSource(nvml)
    assert src.sample() is None and src.sample() is None
    assert nvml.inits == 1
    assert src.topology() is Topology.UNKNOWN
    assert src.absent_reason and "driver" in src.absent_reason
    mgr = MemoryManager(None, src, clock=FakeClock(), topology=None)
    if not mgr.unified:
        snap = mgr.report()
        assert snap["accelerator"]["capacity_bytes"] is None
        assert snap["counters"]["telemetry_errors"] == 0
        assert mgr.accelerator_telemetry_status() == ("unavailable", src.absent_reason)


def test_nvml_sums_discrete_devices() -> None:
    nvml = FakeNvml([(80 * GIB, 70 * GIB), (80 * GIB, 10 * GIB)])
    src = NvmlAcceleratorSource(nvml)
    s = src.sample()
    assert s is not None
    assert (s.capacity_bytes, s.available_bytes, s.source) == (160 * GIB, 80 * GIB, "nvml")
    assert src.topology() is Topology.DISCRETE
    assert detect_topology(src, unified=False) is Topology.DISCRETE
    assert detect_topology(src, unified=True) is Topology.UNIFIED
    mgr = MemoryManager(None, src, clock=FakeClock(), topology=Topology.DISCRETE)
    snap = mgr.report()
    assert snap["accelerator"]["pressure"] == "normal"  # 50 %
    assert mgr.accelerator_telemetry_status()[0] == "supported"
    src.close()
    assert nvml.shutdowns == 1


def test_nvml_unsupported_memory_query_is_unknown_not_error() -> None:
    nvml = FakeNvml([(GIB, GIB)])
    nvml.mem_error = FakeNvml.NVML_ERROR_NOT_SUPPORTED
    src = NvmlAcceleratorSource(nvml)
    assert src.sample() is None
    assert src.topology() is Topology.UNKNOWN


def test_nvml_failure_is_a_telemetry_error() -> None:
    nvml = FakeNvml([(GIB, GIB)])
    src = NvmlAcceleratorSource(nvml)
    nvml.mem_error = 15  # GPU is lost
    with pytest.raises(TelemetryError):
        src.sample()
    mgr = MemoryManager(None, src, clock=FakeClock(), topology=Topology.DISCRETE)
    snap = mgr.report()
    assert snap["accelerator"]["capacity_bytes"] is None
    assert snap["counters"]["telemetry_errors"] == 1
    assert mgr.accelerator_telemetry_status(max_age_s=0)[0] == "unavailable"


def test_nvml_no_devices_is_unknown() -> None:
    src = NvmlAcceleratorSource(FakeNvml([]))
    assert src.sample() is None
    assert src.topology() is Topology.UNKNOWN


# --------------------------------------------------------------------------- this host


def _gpu_driver_present() -> bool:
    return Path("/proc/driver/nvidia").exists() or shutil.which("nvidia-smi") is not None


def test_real_host_memory_is_positive() -> None:
    s = HostMemorySource().sample()
    assert 0 < s.capacity_bytes <= HostMemorySource(use_cgroup=False).sample().capacity_bytes
    assert 0 <= s.available_bytes <= s.capacity_bytes
    mgr = MemoryManager(HostMemorySource(), NvmlAcceleratorSource())
    snap = mgr.report()
    assert snap["host"]["capacity_bytes"] == s.capacity_bytes
    assert snap["host"]["pressure"] in ("normal", "soft", "hard", "emergency")
    assert mgr.host_telemetry_status()[0] == "supported"
    assert mgr.reservations_status(False)[0] == "unavailable"


def test_real_nvml_reports_unknown_without_a_driver() -> None:
    if _gpu_driver_present():
        pytest.skip("an NVIDIA driver is present: accelerator capacity is measurable here")
    src = NvmlAcceleratorSource()
    assert src.sample() is None
    assert src.topology() is Topology.UNKNOWN
    mgr = MemoryManager(HostMemorySource(), src)
    snap = mgr.report()
    assert snap["accelerator"]["capacity_bytes"] is None
    assert snap["accelerator"]["available_bytes"] is None
    assert snap["accelerator"]["pressure"] == "unknown"
    assert mgr.accelerator_telemetry_status()[0] == "unavailable"


NVML_PROBE = """
import json, sys
from werk_host.memory.telemetry import NvmlAcceleratorSource

source = NvmlAcceleratorSource()
print(json.dumps([source.sample(), source.absent_reason, "pynvml" in sys.modules]))
"""


def test_without_the_driver_library_the_binding_is_not_imported() -> None:
    if ctypes.util.find_library("nvidia-ml") is not None or _gpu_driver_present():
        pytest.skip("NVIDIA's NVML library is installed here")
    done = subprocess.run([sys.executable, "-c", NVML_PROBE], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    sample, reason, imported = json.loads(done.stdout)
    assert sample is None and reason == "no NVIDIA driver (NVML could not be initialized)"
    assert imported is False


def test_real_nvml_matches_nvidia_smi() -> None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        pytest.skip("no nvidia-smi on this host: no GPU to compare NVML against")
    out = subprocess.run(
        [smi, "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    total_mib = sum(int(line) for line in out.split())
    s = NvmlAcceleratorSource().sample()
    assert s is not None
    assert abs(s.capacity_bytes // MIB - total_mib) <= len(out.split())  # rounding per device

"""Manager: report shape, telemetry failures, reservations, commit, release and the latch."""

from __future__ import annotations

import threading

import pytest

from werk_host.errors import ErrorCode, WerkError
from werk_host.memory import COUNTER_NAMES, MemoryManager, MemoryTier, Topology

from .fakes import GIB, FakeClock, FakeSource

# Key order and nesting of the seed's /werk/v1/memory example data.
SEED_EXAMPLE = {
    "observed_at_unix_ms": 1788444000000,
    "overall_pressure": "normal",
    "topology": "discrete",
    "host": {
        "capacity_bytes": 68719476736,
        "available_bytes": 42949672960,
        "managed_bytes": 0,
        "reserved_bytes": 0,
        "pressure": "normal",
    },
    "accelerator": {
        "capacity_bytes": None,
        "available_bytes": None,
        "managed_bytes": 0,
        "reserved_bytes": 0,
        "pressure": "unknown",
    },
    "last_action_unix_ms": None,
    "counters": {
        "active_reservations": 0,
        "managed_allocations": 0,
        "pressure_actions_in_flight": 0,
        "completed_demotions": 0,
        "completed_evictions": 0,
        "failed_releases": 0,
        "orphaned_release_bytes": 0,
        "telemetry_errors": 0,
        "backend_cleanup_failures": 0,
        "backend_cleanup_latched": 0,
    },
}


def _err(exc: pytest.ExceptionInfo[WerkError]) -> ErrorCode:
    return exc.value.code


# ------------------------------------------------------------------------------ report


def test_report_reproduces_the_seed_example(clock: FakeClock, wall: FakeClock) -> None:
    host = FakeSource(capacity=68719476736, used=68719476736 - 42949672960)
    mgr = MemoryManager(host, FakeSource(capacity=None), clock=clock, wall_clock=wall, topology=Topology.DISCRETE)
    snap = mgr.report()
    assert snap == SEED_EXAMPLE
    assert list(snap) == list(SEED_EXAMPLE)
    assert list(snap["host"]) == list(SEED_EXAMPLE["host"])  # type: ignore[call-overload]
    assert tuple(snap["counters"]) == COUNTER_NAMES


def test_report_validates_against_protocol_dto(manager: MemoryManager) -> None:
    telemetry = pytest.importorskip("werk_host.protocol.telemetry")
    report = telemetry.MemoryReport.model_validate(manager.report())
    assert report.accelerator.capacity_bytes is None


def test_no_accelerator_source_is_null_and_unknown(clock: FakeClock, wall: FakeClock) -> None:
    mgr = MemoryManager(FakeSource(), None, clock=clock, wall_clock=wall)
    snap = mgr.report()
    assert snap["accelerator"]["capacity_bytes"] is None
    assert snap["accelerator"]["pressure"] == "unknown"
    assert snap["overall_pressure"] == "normal"
    assert snap["counters"]["telemetry_errors"] == 0
    assert snap["topology"] in ("unknown", "unified")


def test_topology_from_accelerator_source(clock: FakeClock, wall: FakeClock) -> None:
    accel = FakeSource(capacity=80 * GIB, topology=Topology.DISCRETE)
    mgr = MemoryManager(FakeSource(), accel, clock=clock, wall_clock=wall, topology=None)
    if mgr.unified:  # pragma: no cover - Apple silicon
        pytest.skip("Apple silicon is unified by detection")
    assert mgr.report()["topology"] == "discrete"


def test_overall_pressure_is_worst_known(clock: FakeClock, wall: FakeClock) -> None:
    host, accel = FakeSource(), FakeSource(capacity=80 * GIB)
    mgr = MemoryManager(host, accel, clock=clock, wall_clock=wall, topology=Topology.DISCRETE)
    host.set_pct(10)
    accel.set_pct(90)
    snap = mgr.report()
    assert (snap["host"]["pressure"], snap["accelerator"]["pressure"], snap["overall_pressure"]) == (
        "normal",
        "hard",
        "hard",
    )


# ----------------------------------------------------------------------------- telemetry failure


def test_failed_sample_counts_and_keeps_accounting(manager: MemoryManager, host: FakeSource) -> None:
    res = manager.reserve("host", GIB, state_id="st_a")
    alloc = manager.commit(res, GIB // 2)
    manager.reserve("host", GIB)
    host.fail = True
    snap = manager.report()
    assert snap["host"] == {
        "capacity_bytes": None,
        "available_bytes": None,
        "managed_bytes": GIB // 2,
        "reserved_bytes": GIB,
        "pressure": "unknown",
    }
    assert snap["overall_pressure"] == "unknown"
    assert snap["counters"]["telemetry_errors"] == 1
    assert snap["counters"]["managed_allocations"] == 1
    assert snap["counters"]["active_reservations"] == 1
    assert manager.report()["counters"]["telemetry_errors"] == 2
    assert manager.host_telemetry_status(max_age_s=0) == (
        "unavailable",
        "the latest host memory sample failed",
    )
    host.fail = False
    snap = manager.report()
    assert snap["host"]["capacity_bytes"] == host.capacity
    assert snap["counters"]["telemetry_errors"] == 3  # the status probe sampled too
    assert alloc.nbytes == GIB // 2


def test_bad_sample_type_counts_as_failure(clock: FakeClock, wall: FakeClock) -> None:
    class Liar:
        def sample(self) -> object:
            return {"capacity_bytes": 1}

    mgr = MemoryManager(Liar(), None, clock=clock, wall_clock=wall)  # type: ignore[arg-type]
    snap = mgr.report()
    assert snap["host"]["capacity_bytes"] is None
    assert snap["counters"]["telemetry_errors"] == 1


def test_absent_accelerator_is_not_an_error(manager: MemoryManager) -> None:
    for _ in range(3):
        manager.report()
    assert manager.counters()["telemetry_errors"] == 0


def test_reserve_with_unknown_capacity_is_unavailable(manager: MemoryManager, host: FakeSource) -> None:
    with pytest.raises(WerkError) as exc:
        manager.reserve("accelerator", 1)
    assert _err(exc) is ErrorCode.UNAVAILABLE
    host.fail = True
    with pytest.raises(WerkError) as exc:
        manager.reserve("host", 1)
    assert _err(exc) is ErrorCode.UNAVAILABLE
    assert manager.counters()["active_reservations"] == 0


# ----------------------------------------------------------------------------- admission


def test_admission_is_strictly_below_hard(clock: FakeClock, wall: FakeClock) -> None:
    host = FakeSource(capacity=10_000, used=5_000)
    mgr = MemoryManager(host, None, clock=clock, wall_clock=wall)
    with pytest.raises(WerkError) as exc:
        mgr.reserve("host", 3_500)  # exactly 85 %
    assert _err(exc) is ErrorCode.RESOURCE_EXHAUSTED and exc.value.retryable
    res = mgr.reserve("host", 3_499)
    assert res.active and mgr.counters()["active_reservations"] == 1
    with pytest.raises(WerkError):
        mgr.reserve("host", 1)  # reserved bytes count toward projection
    res.release()
    mgr.reserve("host", 1)


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, None, "10"])
def test_reserve_rejects_non_positive_sizes(manager: MemoryManager, bad: object) -> None:
    with pytest.raises(WerkError) as exc:
        manager.reserve("host", bad)  # type: ignore[arg-type]
    assert _err(exc) is ErrorCode.INVALID_REQUEST


def test_reserve_rejects_unknown_tier(manager: MemoryManager) -> None:
    with pytest.raises(WerkError) as exc:
        manager.reserve("vram", 1)
    assert _err(exc) is ErrorCode.INVALID_REQUEST


def test_managed_bytes_count_only_beyond_observed_use(clock: FakeClock, wall: FakeClock) -> None:
    host = FakeSource(capacity=10_000, used=1_000)
    mgr = MemoryManager(host, None, clock=clock, wall_clock=wall)
    mgr.commit(mgr.reserve("host", 4_000), 4_000)
    # Observed use (1 000) has not caught up with the 4 000 managed bytes: 4 000 counts.
    with pytest.raises(WerkError):
        mgr.reserve("host", 4_500)
    # Once the sample shows the allocation (5 000 used), managed is not added again.
    host.used = 5_000
    mgr.reserve("host", 3_499)


# ----------------------------------------------------------------------------- commit


def test_commit_converts_reservation(manager: MemoryManager) -> None:
    res = manager.reserve("host", 4 * GIB, state_id="st_1")
    alloc = res.commit(3 * GIB)
    snap = manager.report()
    assert snap["host"]["managed_bytes"] == 3 * GIB
    assert snap["host"]["reserved_bytes"] == 0
    assert snap["counters"]["managed_allocations"] == 1
    assert snap["counters"]["active_reservations"] == 0
    assert alloc.state_id == "st_1" and not alloc.pinned
    with pytest.raises(WerkError) as exc:
        manager.commit(res, GIB)
    assert _err(exc) is ErrorCode.CONFLICT


@pytest.mark.parametrize("actual", [None, 0, -5, 4 * GIB + 1, True])
def test_commit_refuses_disagreeing_state(manager: MemoryManager, actual: object) -> None:
    res = manager.reserve("host", 4 * GIB)
    with pytest.raises(WerkError) as exc:
        manager.commit(res, actual)  # type: ignore[arg-type]
    assert _err(exc) is ErrorCode.INTERNAL
    assert not res.active
    c = manager.counters()
    assert (c["active_reservations"], c["managed_allocations"]) == (0, 0)
    assert manager.report()["host"]["reserved_bytes"] == 0


def test_reservation_context_manager(manager: MemoryManager) -> None:
    with pytest.raises(RuntimeError), manager.reserve("host", GIB) as res:
        assert manager.counters()["active_reservations"] == 1
        raise RuntimeError("backend load failed")
    assert not res.active and manager.counters()["active_reservations"] == 0

    with manager.reserve("host", GIB):
        pass  # never committed: released on exit
    assert manager.report()["host"]["reserved_bytes"] == 0

    with manager.reserve("host", GIB) as res:
        alloc = res.commit(GIB)
    assert manager.report()["host"]["managed_bytes"] == GIB
    assert not alloc.released


def test_objects_of_another_manager_are_rejected(manager: MemoryManager, clock: FakeClock) -> None:
    other = MemoryManager(FakeSource(), None, clock=clock)
    res = other.reserve("host", 1)
    with pytest.raises(WerkError) as exc:
        manager.commit(res, 1)
    assert _err(exc) is ErrorCode.INVALID_REQUEST


# ----------------------------------------------------------------------------- release and latch


def test_release_frees_accounting(manager: MemoryManager) -> None:
    alloc = manager.reserve("host", GIB).commit(GIB)
    calls: list[int] = []
    alloc.release(lambda: calls.append(1))
    assert alloc.released and calls == [1]
    assert manager.report()["host"]["managed_bytes"] == 0
    alloc.release(lambda: calls.append(2))  # idempotent: backend not called again
    assert calls == [1]
    assert manager.counters()["managed_allocations"] == 0


def _boom() -> None:
    raise OSError("slot erase failed: /secret/path")


def test_failed_release_latches(manager: MemoryManager) -> None:
    alloc = manager.reserve("host", 2 * GIB, state_id="st_x").commit(2 * GIB)
    with pytest.raises(WerkError) as exc:
        manager.release(alloc, _boom)
    assert _err(exc) is ErrorCode.UNAVAILABLE and not exc.value.retryable
    assert "/secret" not in exc.value.message
    snap = manager.report()
    assert snap["host"]["managed_bytes"] == 2 * GIB  # capacity not claimed as freed
    c = snap["counters"]
    assert c["failed_releases"] == 1
    assert c["backend_cleanup_failures"] == 1
    assert c["orphaned_release_bytes"] == 2 * GIB
    assert c["backend_cleanup_latched"] == 1
    assert c["managed_allocations"] == 1
    assert alloc.pinned and not alloc.released
    assert manager.pinned_state_ids() == frozenset({"st_x"})

    with pytest.raises(WerkError) as exc:
        manager.check_mutation_allowed()
    assert _err(exc) is ErrorCode.UNAVAILABLE
    with pytest.raises(WerkError) as exc:
        manager.reserve("host", 1)
    assert _err(exc) is ErrorCode.UNAVAILABLE
    assert manager.reservations_status(True)[0] == "unavailable"

    # A second failure counts again but orphans the same bytes only once.
    with pytest.raises(WerkError):
        manager.release(alloc, _boom)
    c = manager.counters()
    assert (c["failed_releases"], c["backend_cleanup_failures"], c["orphaned_release_bytes"]) == (
        2,
        2,
        2 * GIB,
    )

    manager.clear_cleanup_latch()
    manager.check_mutation_allowed()
    assert manager.counters()["backend_cleanup_latched"] == 0
    assert alloc.pinned  # still pinned until the backend confirms cleanup
    manager.reserve("host", 1)

    manager.release(alloc, lambda: None)
    c = manager.counters()
    assert c["orphaned_release_bytes"] == 0 and c["failed_releases"] == 2
    assert manager.report()["host"]["managed_bytes"] == 0
    assert manager.pinned_state_ids() == frozenset()


def test_service_level_cleanup_failure(manager: MemoryManager) -> None:
    manager.record_backend_cleanup_failure(None)  # unknown size adds zero
    manager.record_backend_cleanup_failure(123)
    c = manager.counters()
    assert (c["backend_cleanup_failures"], c["orphaned_release_bytes"], c["backend_cleanup_latched"]) == (
        2,
        123,
        1,
    )
    assert c["failed_releases"] == 0


def test_concurrent_release_conflicts(manager: MemoryManager) -> None:
    alloc = manager.reserve("host", GIB).commit(GIB)
    inside = threading.Event()
    go = threading.Event()

    def slow() -> None:
        inside.set()
        go.wait(5)

    t = threading.Thread(target=manager.release, args=(alloc, slow))
    t.start()
    assert inside.wait(5)
    with pytest.raises(WerkError) as exc:
        manager.release(alloc, lambda: None)
    assert _err(exc) is ErrorCode.CONFLICT
    go.set()
    t.join(5)
    assert alloc.released


# ----------------------------------------------------------------------------- unified topology


def test_unified_topology_shares_one_pool(clock: FakeClock, wall: FakeClock) -> None:
    host = FakeSource(capacity=10_000, used=2_000)
    accel = FakeSource(capacity=999)  # ignored: the GPU shares host memory
    mgr = MemoryManager(host, accel, clock=clock, wall_clock=wall, topology=Topology.UNIFIED)
    mgr.reserve(MemoryTier.ACCELERATOR, 3_000)
    mgr.commit(mgr.reserve("host", 1_000), 1_000)
    snap = mgr.report()
    assert snap["topology"] == "unified"
    assert snap["host"] == snap["accelerator"]
    assert snap["host"]["reserved_bytes"] == 3_000 and snap["host"]["managed_bytes"] == 1_000
    assert accel.samples == 0
    with pytest.raises(WerkError):  # 2 000 used + 3 000 reserved + 3 500 = 85 %
        mgr.reserve("accelerator", 3_500)
    assert mgr.accelerator_telemetry_status()[0] == "supported"


# ----------------------------------------------------------------------------- capability evidence


def test_capability_evidence(manager: MemoryManager, host: FakeSource, clock: FakeClock) -> None:
    assert manager.host_telemetry_status()[0] == "supported"
    assert manager.accelerator_telemetry_status()[0] == "unavailable"
    status, detail = manager.reservations_status(False)
    assert status == "unavailable" and "bounded" in detail
    assert manager.reservations_status(True)[0] == "supported"
    assert manager.reservations_status(True, MemoryTier.ACCELERATOR)[0] == "unavailable"
    host.fail = True
    assert manager.host_telemetry_status()[0] == "supported"  # cached sample is still fresh
    clock.advance(3)
    assert manager.host_telemetry_status()[0] == "unavailable"
    assert manager.reservations_status(True)[0] == "unavailable"


def test_concurrent_reservations_never_cross_hard(clock: FakeClock) -> None:
    host = FakeSource(capacity=1_000_000)
    mgr = MemoryManager(host, None, clock=clock)
    admitted: list[int] = []
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(200):
            try:
                mgr.reserve("host", 997)
            except WerkError as exc:
                assert exc.code is ErrorCode.RESOURCE_EXHAUSTED
            else:
                with lock:
                    admitted.append(997)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    total = sum(admitted)
    assert 100 * total < 85 * 1_000_000
    assert total + 997 >= 850_000  # it did fill up to the threshold
    assert mgr.report()["host"]["reserved_bytes"] == total

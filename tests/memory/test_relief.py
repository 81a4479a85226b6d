"""Denied reservations: one bounded relief pass, LRU demotions before evictions, one retry."""

from __future__ import annotations

import pytest

from werk_host.errors import ErrorCode, WerkError
from werk_host.memory import MemoryManager, MemoryTier, ReliefCandidate, Topology

from .fakes import FakeClock, FakeSource, RecordingExecutor

H = MemoryTier.HOST


def cand(
    sid: str,
    size: int | None,
    t: int,
    *,
    demote: bool = True,
    pinned: bool = False,
    handoff: bool = False,
    tier: MemoryTier = H,
) -> ReliefCandidate:
    return ReliefCandidate(sid, tier, size, t, pinned=pinned, handoff_live=handoff, can_demote=demote)


def make(clock: FakeClock, wall: FakeClock, used: int = 6_000, **kw: int) -> tuple[MemoryManager, FakeSource]:
    host = FakeSource(capacity=10_000, used=used)
    mgr = MemoryManager(host, None, clock=clock, wall_clock=wall, topology=Topology.DISCRETE, **kw)  # type: ignore[arg-type]
    return mgr, host


def test_lru_demotions_before_evictions_even_at_normal_pressure(clock: FakeClock, wall: FakeClock) -> None:
    mgr, host = make(clock, wall)  # 60 %: normal before the request
    assert mgr.report()["host"]["pressure"] == "normal"
    ex = RecordingExecutor(
        host,
        [
            cand("evict_oldest", 1_000, 0, demote=False),
            cand("b", 300, 5),
            cand("a", 300, 1),
            cand("newest", 300, 9),
            cand("pinned", 5_000, 0, pinned=True),
            cand("live", 5_000, 0, handoff=True),
            cand("unknown", None, 0),
            cand("other_tier", 5_000, 0, tier=MemoryTier.ACCELERATOR),
        ],
        manager=mgr,
    )
    host.samples = 0
    res = mgr.reserve("host", 3_000, relief=ex)  # 90 % projected: needs >= 501 freed
    assert ex.calls == [("demote", "a"), ("demote", "b")]
    assert ex.in_flight_seen == [1, 1]
    assert res.active
    assert host.samples == 2  # the denied admission and exactly one retry
    snap = mgr.report()
    c = snap["counters"]
    assert (c["completed_demotions"], c["completed_evictions"], c["pressure_actions_in_flight"]) == (2, 0, 0)
    assert snap["last_action_unix_ms"] == int(wall.now * 1000)


def test_evictions_follow_when_demotions_do_not_suffice(clock: FakeClock, wall: FakeClock) -> None:
    mgr, host = make(clock, wall)
    ex = RecordingExecutor(host, [cand("c", 1_000, 0, demote=False), cand("b", 100, 2), cand("a", 300, 1)])
    mgr.reserve("host", 3_700, relief=ex)  # needs >= 1 201
    assert ex.calls == [("demote", "a"), ("demote", "b"), ("evict", "c")]
    c = mgr.counters()
    assert (c["completed_demotions"], c["completed_evictions"]) == (2, 1)


def test_per_cycle_bound_picks_a_feasible_plan(clock: FakeClock, wall: FakeClock) -> None:
    mgr, host = make(clock, wall, max_relief_actions=1)
    ex = RecordingExecutor(host, [cand("small", 300, 0), cand("big", 1_000, 5, demote=False)])
    mgr.reserve("host", 3_000, relief=ex)
    assert ex.calls == [("evict", "big")]


def test_cooldown_blocks_a_second_pass(clock: FakeClock, wall: FakeClock) -> None:
    mgr, host = make(clock, wall)
    ex = RecordingExecutor(host, [cand(f"s{i}", 600, i) for i in range(6)])
    mgr.reserve("host", 3_000, relief=ex)
    assert len(ex.calls) == 1
    clock.advance(4.9)
    with pytest.raises(WerkError) as exc:
        mgr.reserve("host", 1_000, relief=ex)
    assert exc.value.code is ErrorCode.RESOURCE_EXHAUSTED and exc.value.retryable
    assert len(ex.calls) == 1
    clock.advance(0.1)
    mgr.reserve("host", 1_000, relief=ex)
    assert len(ex.calls) == 3


def test_infeasible_plan_moves_nothing_and_does_not_retry(clock: FakeClock, wall: FakeClock) -> None:
    mgr, host = make(clock, wall)
    ex = RecordingExecutor(host, [cand("p", 5_000, 0, pinned=True), cand("x", 200, 1), cand("u", None, 0)])
    host.samples = 0
    with pytest.raises(WerkError) as exc:
        mgr.reserve("host", 3_000, relief=ex)
    assert exc.value.code is ErrorCode.RESOURCE_EXHAUSTED
    assert ex.calls == []
    assert host.samples == 1
    assert mgr.report()["last_action_unix_ms"] is None


def test_no_executor_no_relief(clock: FakeClock, wall: FakeClock) -> None:
    mgr, _ = make(clock, wall)
    with pytest.raises(WerkError) as exc:
        mgr.reserve("host", 3_000)
    assert exc.value.code is ErrorCode.RESOURCE_EXHAUSTED


def test_exactly_one_retry_when_relief_frees_less_than_claimed(clock: FakeClock, wall: FakeClock) -> None:
    mgr, host = make(clock, wall)
    ex = RecordingExecutor(host, [cand("a", 600, 0)])
    ex.source = FakeSource()  # moves happen "elsewhere": our pool does not shrink
    host.samples = 0
    with pytest.raises(WerkError) as exc:
        mgr.reserve("host", 3_000, relief=ex)
    assert exc.value.code is ErrorCode.RESOURCE_EXHAUSTED
    assert ex.calls == [("demote", "a")]
    assert host.samples == 2


def test_failed_action_stops_the_pass(clock: FakeClock, wall: FakeClock) -> None:
    mgr, host = make(clock, wall)
    ex = RecordingExecutor(host, [cand("a", 300, 0), cand("b", 300, 1)], fail_on={"a"})
    with pytest.raises(WerkError):
        mgr.reserve("host", 3_000, relief=ex)
    assert ex.calls == [("demote", "a")]
    snap = mgr.report()
    assert snap["counters"]["completed_demotions"] == 0
    assert snap["counters"]["pressure_actions_in_flight"] == 0
    assert snap["last_action_unix_ms"] is not None  # the attempt starts the cooldown


def test_allocation_pinned_by_failed_release_is_never_moved(clock: FakeClock, wall: FakeClock) -> None:
    mgr, host = make(clock, wall, used=1_000)
    alloc = mgr.reserve("host", 3_000, state_id="stuck").commit(3_000)
    host.used = 4_000

    def boom() -> None:
        raise RuntimeError("erase failed")

    with pytest.raises(WerkError):
        mgr.release(alloc, boom)
    ex = RecordingExecutor(host, [cand("stuck", 3_000, 0), cand("ok", 1_000, 5)])
    with pytest.raises(WerkError) as exc:  # latched: no reservation, no relief
        mgr.reserve("host", 5_000, relief=ex)
    assert exc.value.code is ErrorCode.UNAVAILABLE and ex.calls == []
    mgr.clear_cleanup_latch()
    mgr.reserve("host", 5_000, relief=ex)  # 90 % projected; 80 % after freeing "ok"
    assert ex.calls == [("demote", "ok")]


def test_candidate_listing_failure_is_a_denial(clock: FakeClock, wall: FakeClock) -> None:
    mgr, host = make(clock, wall)

    class Broken(RecordingExecutor):
        def relief_candidates(self, tier: MemoryTier) -> list[ReliefCandidate]:
            raise RuntimeError("backend down")

    with pytest.raises(WerkError) as exc:
        mgr.reserve("host", 3_000, relief=Broken(host))
    assert exc.value.code is ErrorCode.RESOURCE_EXHAUSTED

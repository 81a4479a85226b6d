"""The pure relief planner: examples and hypothesis properties."""

from __future__ import annotations

from itertools import combinations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from werk_host.memory import (
    DEFAULT_THRESHOLDS,
    MemoryTier,
    ReliefCandidate,
    ReliefKind,
    ReliefPlan,
    Thresholds,
    max_used_below_hard,
    plan_relief,
)

H = MemoryTier.HOST


def c(sid: str, size: int | None, t: int, demote: bool = True, **kw: bool) -> ReliefCandidate:
    return ReliefCandidate(sid, H, size, t, can_demote=demote, **kw)


def below_hard(used: int, capacity: int, th: Thresholds) -> bool:
    return 100 * used < th.hard_pct * capacity


def test_max_used_below_hard_is_exact() -> None:
    for cap in (1, 7, 100, 10_000, 12_345):
        m = max_used_below_hard(cap, DEFAULT_THRESHOLDS)
        assert below_hard(m, cap, DEFAULT_THRESHOLDS)
        assert not below_hard(m + 1, cap, DEFAULT_THRESHOLDS)


def test_nothing_needed_gives_empty_feasible_plan() -> None:
    plan = plan_relief([c("a", 10, 0)], 100, 10_000, 1_000, DEFAULT_THRESHOLDS, 4)
    assert plan == ReliefPlan((), 0, 0, 1_100, True)


def test_preference_and_kinds() -> None:
    cands = [
        c("e_old", 500, 0, demote=False),
        c("d_new", 500, 9),
        c("d_old", 500, 3),
        c("e_new", 500, 8, False),
    ]
    plan = plan_relief(cands, 3_000, 10_000, 6_000, DEFAULT_THRESHOLDS, 8)  # need >= 501
    assert [(a.kind, a.state_id) for a in plan.actions] == [
        (ReliefKind.DEMOTE, "d_old"),
        (ReliefKind.DEMOTE, "d_new"),
    ]
    plan = plan_relief(cands, 3_000, 10_000, 7_000, DEFAULT_THRESHOLDS, 8)  # need >= 1 501
    assert [a.state_id for a in plan.actions] == ["d_old", "d_new", "e_old", "e_new"]
    assert plan.feasible and plan.freed_bytes == 2_000 and plan.projected_used_bytes == 8_000


def test_duplicates_use_the_first_entry() -> None:
    cands = [c("a", 600, 0, pinned=True), c("a", 600, 0), c("b", 600, 5)]
    plan = plan_relief(cands, 3_000, 10_000, 6_000, DEFAULT_THRESHOLDS, 8)
    assert [a.state_id for a in plan.actions] == ["b"]


def test_request_larger_than_hard_share_is_infeasible() -> None:
    plan = plan_relief([c("a", 10**9, 0)], 9_000, 10_000, 0, DEFAULT_THRESHOLDS, 8)
    assert not plan.feasible and plan.actions == ()


@pytest.mark.parametrize("args", [(0, 0, 0), (10, -1, 0), (10, 0, -1)])
def test_invalid_inputs(args: tuple[int, int, int]) -> None:
    cap, used, k = args
    with pytest.raises(ValueError):
        plan_relief([], 1, cap, used, DEFAULT_THRESHOLDS, k)


# --------------------------------------------------------------------------- properties

candidate = st.builds(
    lambda size, t, pinned, handoff, demote: (size, t, pinned, handoff, demote),
    st.one_of(st.none(), st.integers(min_value=-5, max_value=3_000)),
    st.integers(min_value=0, max_value=20),
    st.booleans(),
    st.booleans(),
    st.booleans(),
)

thresholds = st.builds(
    lambda s, gap1, gap2, hyst: Thresholds(s, s + gap1, min(100, s + gap1 + gap2), min(hyst, s - 1)),
    st.integers(min_value=10, max_value=80),
    st.integers(min_value=1, max_value=9),
    st.integers(min_value=1, max_value=9),
    st.integers(min_value=0, max_value=9),
).filter(lambda th: th.hard_pct < th.emergency_pct)


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[ReliefCandidate], int, int, int, Thresholds, int]:
    raw = draw(st.lists(candidate, max_size=9))
    cands = [
        ReliefCandidate(f"s{i}", H, size, t, pinned=p, handoff_live=hl, can_demote=d)
        for i, (size, t, p, hl, d) in enumerate(raw)
    ]
    capacity = draw(st.integers(min_value=1, max_value=12_000))
    used = draw(st.integers(min_value=0, max_value=capacity + 2_000))
    need = draw(st.integers(min_value=0, max_value=capacity))
    th = draw(thresholds)
    k = draw(st.integers(min_value=0, max_value=6))
    return cands, need, capacity, used, th, k


def feasible_by_brute_force(
    cands: list[ReliefCandidate], need: int, capacity: int, used: int, th: Thresholds, k: int
) -> bool:
    usable = [x.bytes for x in cands if not x.pinned and not x.handoff_live and x.bytes is not None and x.bytes > 0]
    for r in range(min(k, len(usable)) + 1):
        for subset in combinations(usable, r):
            if below_hard(used + need - min(sum(subset), used), capacity, th):
                return True
    return False


@settings(max_examples=600, deadline=None)
@given(scenarios())
def test_planner_properties(s: tuple[list[ReliefCandidate], int, int, int, Thresholds, int]) -> None:
    cands, need, capacity, used, th, k = s
    plan = plan_relief(cands, need, capacity, used, th, k)  # returning at all = termination
    by_id = {x.state_id: x for x in cands}
    chosen = [by_id[a.state_id] for a in plan.actions]

    # Never pinned, handoff-live or unknown/non-positive size; each state at most once.
    assert all(not x.pinned and not x.handoff_live and x.bytes is not None and x.bytes > 0 for x in chosen)
    assert len({a.state_id for a in plan.actions}) == len(plan.actions)
    # Per-cycle bound.
    assert len(plan.actions) <= k or (k == 0 and not plan.actions)
    # Kinds follow can_demote; every demotion precedes every eviction; LRU within a kind.
    assert all((a.kind is ReliefKind.DEMOTE) == by_id[a.state_id].can_demote for a in plan.actions)
    kinds = [a.kind for a in plan.actions]
    assert kinds == sorted(kinds, key=lambda kind: kind is ReliefKind.EVICT)
    for kind in ReliefKind:
        times = [by_id[a.state_id].last_accessed_unix_ms for a in plan.actions if a.kind is kind]
        assert times == sorted(times)
    # Bookkeeping.
    assert plan.freed_bytes == sum(a.bytes for a in plan.actions)
    assert plan.projected_used_bytes == used + need - min(plan.freed_bytes, used)
    # Feasibility computed independently.
    feasible = feasible_by_brute_force(cands, need, capacity, used, th, k)
    assert plan.feasible == feasible
    if feasible:
        assert below_hard(plan.projected_used_bytes, capacity, th)
    else:
        assert plan.actions == ()


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_ample_bound_takes_the_shortest_preference_prefix(
    s: tuple[list[ReliefCandidate], int, int, int, Thresholds, int],
) -> None:
    cands, need, capacity, used, th, _ = s
    plan = plan_relief(cands, need, capacity, used, th, len(cands))
    if not plan.feasible:
        return
    eligible = [x for x in cands if x.eligible]
    order = sorted(eligible, key=lambda x: (not x.can_demote, x.last_accessed_unix_ms, x.state_id))
    prefix: list[str] = []
    freed = 0
    for x in order:
        if below_hard(used + need - min(freed, used), capacity, th):
            break
        prefix.append(x.state_id)
        assert x.bytes is not None
        freed += x.bytes
    assert [a.state_id for a in plan.actions] == prefix


@settings(max_examples=50, deadline=2_000)
@given(st.integers(min_value=1, max_value=64))
def test_large_inputs_terminate_quickly(k: int) -> None:
    cands = [c(f"s{i}", 1 + (i * 7919) % 5_000, i % 97, demote=i % 3 == 0) for i in range(2_000)]
    plan = plan_relief(cands, 10**6, 10**7, 9 * 10**6, DEFAULT_THRESHOLDS, k)
    assert len(plan.actions) <= k

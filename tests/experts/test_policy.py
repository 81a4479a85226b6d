"""The expert policy engine (werk_host.experts): examples and hypothesis properties of its invariants."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from werk_host.errors import ErrorCode, WerkError
from werk_host.experts import AccessEvent, ExpertObservation, ExpertPolicy, PolicySettings
from werk_host.protocol import ExpertListQuery, ExpertTier

MODEL = "moe"


@dataclass
class Clock:
    now: int = 1_000_000

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


def policy(clock: Clock, half_life_s: float = 10.0, cooldown_s: float = 5.0) -> ExpertPolicy:
    return ExpertPolicy(PolicySettings(half_life_s=half_life_s, cooldown_s=cooldown_s), clock=clock)


def obs(i: int, tier: ExpertTier = ExpertTier.EXTERNAL, size: int | None = 100, **kw: object) -> ExpertObservation:
    return ExpertObservation(f"e{i:03d}", MODEL, tier, size, **kw)  # type: ignore[arg-type]


# -- strategies ------------------------------------------------------------------------------------

tiers = st.sampled_from([ExpertTier.RAM, ExpertTier.EXTERNAL])
sizes = st.one_of(st.none(), st.integers(min_value=0, max_value=1000))


@st.composite
def populations(draw: st.DrawFn) -> list[ExpertObservation]:
    n = draw(st.integers(min_value=0, max_value=24))
    return [
        ExpertObservation(
            f"e{i:03d}",
            MODEL,
            draw(tiers),
            draw(sizes),
            pinned=draw(st.booleans()),
            accesses=draw(st.one_of(st.none(), st.integers(min_value=0, max_value=50))),
        )
        for i in range(n)
    ]


# -- hotness ---------------------------------------------------------------------------------------


def test_hotness_decays_by_half_life_and_accesses_add_one() -> None:
    clock = Clock()
    p = policy(clock, half_life_s=10.0)
    p.observe(MODEL, [obs(1)])
    assert p.hotness("e001") == 0.0
    p.record_access([AccessEvent("e001", 4)])
    assert p.hotness("e001") == pytest.approx(4.0)
    clock.advance(10_000)
    assert p.hotness("e001") == pytest.approx(2.0)
    p.record_access([AccessEvent("e001", 1)])
    assert p.hotness("e001") == pytest.approx(3.0)
    clock.advance(20_000)
    assert p.hotness("e001") == pytest.approx(0.75)


def test_cumulative_counters_become_access_events_and_a_restart_counts_anew() -> None:
    clock = Clock()
    p = policy(clock)
    p.observe(MODEL, [obs(1, accesses=5)])
    assert p.hotness("e001") == pytest.approx(5.0)
    p.observe(MODEL, [obs(1, accesses=8)])
    assert p.hotness("e001") == pytest.approx(8.0)
    p.observe(MODEL, [obs(1, accesses=8)])  # nothing new
    assert p.hotness("e001") == pytest.approx(8.0)
    p.observe(MODEL, [obs(1, accesses=2)])  # the backend restarted: 2 new accesses
    assert p.hotness("e001") == pytest.approx(10.0)


@settings(max_examples=60, deadline=None)
@given(
    events=st.lists(
        st.tuples(st.integers(min_value=0, max_value=5_000), st.integers(min_value=0, max_value=9)), max_size=30
    )
)
def test_hotness_is_non_negative_and_never_rises_without_accesses(events: list[tuple[int, int]]) -> None:
    clock = Clock()
    p = policy(clock)
    p.observe(MODEL, [obs(1)])
    for wait, count in events:
        before = p.hotness("e001")
        clock.advance(wait)
        decayed = p.hotness("e001")
        assert 0.0 <= decayed <= before
        p.record_access([AccessEvent("e001", count)])
        assert p.hotness("e001") == pytest.approx(decayed + count)


# -- observations ------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(first=populations(), second=populations())
def test_observations_are_truth_and_unknown_sizes_stay_unknown(
    first: list[ExpertObservation], second: list[ExpertObservation]
) -> None:
    p = policy(Clock())
    p.observe(MODEL, first)
    p.observe(MODEL, second)
    records = {r.expert_id: r for r in p.records(MODEL)}
    assert set(records) == {o.expert_id for o in second}  # ids no longer reported are forgotten
    for o in second:
        r = records[o.expert_id]
        assert (r.tier, r.bytes, r.pinned) == (o.tier, o.bytes, o.pinned)


def test_an_observation_of_another_model_is_refused() -> None:
    p = policy(Clock())
    with pytest.raises(ValueError):
        p.observe("other", [obs(1)])


# -- claims ------------------------------------------------------------------------------------------


def test_claims_conflict_until_released_and_unknown_ids_are_not_found() -> None:
    p = policy(Clock())
    p.observe(MODEL, [obs(1), obs(2), obs(3)])
    with p.claim(["e001", "e002"]):
        with pytest.raises(WerkError) as err, p.claim(["e002", "e003"]):
            pass
        assert err.value.code is ErrorCode.CONFLICT
        with p.claim(["e003"]):  # disjoint: fine
            pass
    with p.claim(["e002"]):  # released on leaving the block
        pass
    with pytest.raises(WerkError) as err, p.claim(["e999"]):
        pass
    assert err.value.code is ErrorCode.NOT_FOUND
    assert p.claimed() == frozenset()


@settings(max_examples=60, deadline=None)
@given(population=populations(), picks=st.lists(st.integers(min_value=0, max_value=23), min_size=1, max_size=6))
def test_metadata_changes_only_when_the_backend_reports_success(
    population: list[ExpertObservation], picks: list[int]
) -> None:
    if not population:
        return
    p = policy(Clock())
    p.observe(MODEL, population)
    ids = [population[i % len(population)].expert_id for i in picks]
    before = p.records(MODEL)
    flipped = [
        ExpertObservation(
            o.expert_id, MODEL, ExpertTier.RAM if o.tier is ExpertTier.EXTERNAL else ExpertTier.EXTERNAL, o.bytes
        )
        for o in population
        if o.expert_id in ids
    ]
    with pytest.raises(RuntimeError), p.claim(ids):
        racing = {o.expert_id: o for o in flipped}
        p.observe(MODEL, [racing.get(o.expert_id, o) for o in population])  # a listing racing the action
        assert p.records(MODEL) == before
        raise RuntimeError("the backend failed")
    assert p.records(MODEL) == before  # a failed action leaves everything as it was
    assert p.claimed() == frozenset()
    with p.claim(ids) as claim:
        claim.commit(flipped)
    after = {r.expert_id: r for r in p.records(MODEL)}
    for o in flipped:
        assert after[o.expert_id].tier is o.tier
        assert after[o.expert_id].last_transition_ms is not None
    with pytest.raises(RuntimeError):
        claim.commit(flipped)


# -- plans -------------------------------------------------------------------------------------------


def test_prefetch_plan_prefers_hot_experts_that_fit() -> None:
    clock = Clock()
    p = policy(clock)
    p.observe(MODEL, [obs(1, size=60, accesses=9), obs(2, size=50, accesses=5), obs(3, size=40, accesses=1)])
    assert p.plan_prefetch(MODEL, ExpertTier.RAM, free_bytes=100, limit=8) == ("e001", "e003")
    assert p.plan_prefetch(MODEL, ExpertTier.RAM, free_bytes=100, limit=1) == ("e001",)


def test_unknown_sizes_never_fit_and_never_count_as_freed() -> None:
    p = policy(Clock())
    p.observe(MODEL, [obs(1, size=None, accesses=99), obs(2, tier=ExpertTier.RAM, size=None)])
    assert p.plan_prefetch(MODEL, ExpertTier.RAM, free_bytes=10**12, limit=8) == ()
    relief = p.plan_relief(MODEL, ExpertTier.RAM, need_bytes=1, limit=8)
    assert relief.expert_ids == () and not relief.satisfied


def test_a_transition_cools_an_expert_down_for_plans() -> None:
    clock = Clock()
    p = policy(clock, cooldown_s=5.0)
    p.observe(MODEL, [obs(1, tier=ExpertTier.RAM)])
    with p.claim(["e001"]) as claim:
        claim.commit([obs(1, tier=ExpertTier.EXTERNAL)])
    assert p.plan_prefetch(MODEL, ExpertTier.RAM, 1000, 8) == ()
    clock.advance(5_000)
    assert p.plan_prefetch(MODEL, ExpertTier.RAM, 1000, 8) == ("e001",)


@settings(max_examples=100, deadline=None)
@given(
    population=populations(),
    free=st.integers(min_value=0, max_value=3000),
    need=st.integers(min_value=0, max_value=3000),
    limit=st.integers(min_value=0, max_value=10),
    claimed=st.sets(st.integers(min_value=0, max_value=23), max_size=5),
    cooled=st.sets(st.integers(min_value=0, max_value=23), max_size=5),
)
def test_plans_are_bounded_and_skip_what_must_not_move(
    population: list[ExpertObservation], free: int, need: int, limit: int, claimed: set[int], cooled: set[int]
) -> None:
    clock = Clock()
    p = policy(clock)
    p.observe(MODEL, population)
    ids = {o.expert_id for o in population}
    cooling = {f"e{i:03d}" for i in cooled} & ids
    with p.claim(sorted(cooling)) as claim:  # a transition now: these cool down
        claim.commit(
            [
                ExpertObservation(o.expert_id, MODEL, o.tier, o.bytes, pinned=not o.pinned)
                for o in population
                if o.expert_id in cooling
            ]
        )
    held = sorted({f"e{i:03d}" for i in claimed} & ids - cooling)
    with p.claim(held):
        records = {r.expert_id: r for r in p.records(MODEL)}
        prefetch = p.plan_prefetch(MODEL, ExpertTier.RAM, free, limit)
        assert len(prefetch) <= limit and len(set(prefetch)) == len(prefetch)
        chosen = [records[i] for i in prefetch]
        assert all(r.tier is not ExpertTier.RAM and r.bytes is not None for r in chosen)
        assert not set(prefetch) & (set(held) | cooling)
        assert sum(r.bytes or 0 for r in chosen) <= free
        hot = [p.hotness(i) for i in prefetch]
        assert hot == sorted(hot, reverse=True)

        relief = p.plan_relief(MODEL, ExpertTier.RAM, need, limit)
        assert len(relief.expert_ids) <= limit
        picked = [records[i] for i in relief.expert_ids]
        assert all(r.tier is ExpertTier.RAM and not r.pinned and r.bytes is not None for r in picked)
        assert not set(relief.expert_ids) & (set(held) | cooling)
        assert relief.freed_bytes == sum(r.bytes or 0 for r in picked)
        assert relief.satisfied == (relief.freed_bytes >= need)
        eligible = [
            r
            for r in records.values()
            if r.tier is ExpertTier.RAM
            and not r.pinned
            and r.bytes is not None
            and r.expert_id not in held
            and r.expert_id not in cooling
        ]
        if not relief.satisfied and len(relief.expert_ids) < limit:
            assert len(picked) == len(eligible)  # it only falls short when nothing else may move


# -- paging ------------------------------------------------------------------------------------------


def test_pages_walk_every_record_once_with_opaque_filter_bound_cursors() -> None:
    p = policy(Clock())
    p.observe(MODEL, [obs(i, tier=ExpertTier.RAM if i % 3 == 0 else ExpertTier.EXTERNAL) for i in range(25)])
    seen: list[str] = []
    cursor: str | None = None
    while True:
        page = p.page(ExpertListQuery(model_id=MODEL, limit=7, cursor=cursor))
        seen += [e.id for e in page.experts]
        cursor = page.next_cursor
        if cursor is None:
            break
        with pytest.raises(WerkError):  # tamper-evident
            p.page(ExpertListQuery(model_id=MODEL, limit=7, cursor=cursor[:-1] + ("0" if cursor[-1] != "0" else "1")))
    assert seen == sorted(f"e{i:03d}" for i in range(25))
    ram = p.page(ExpertListQuery(model_id=MODEL, tier=ExpertTier.RAM, limit=100))
    assert {e.id for e in ram.experts} == {f"e{i:03d}" for i in range(0, 25, 3)}
    first = p.page(ExpertListQuery(model_id=MODEL, limit=5))
    assert first.next_cursor is not None
    with pytest.raises(WerkError) as err:  # a cursor of another filter is refused
        p.page(ExpertListQuery(model_id=MODEL, tier=ExpertTier.RAM, cursor=first.next_cursor))
    assert err.value.code is ErrorCode.INVALID_REQUEST

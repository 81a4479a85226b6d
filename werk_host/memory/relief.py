"""Bounded pressure-relief planning (pure) and the executor contract.

:func:`plan_relief` chooses which states to demote or evict so that a pending
request fits below the hard threshold. It never touches a backend; a
:class:`ReliefExecutor` supplied by the service performs the plan.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol, runtime_checkable

from werk_host.memory.base import MemoryTier, Thresholds


class ReliefKind(StrEnum):
    DEMOTE = "demote"
    EVICT = "evict"


@dataclass(frozen=True, slots=True)
class ReliefCandidate:
    """A state the relief pass may move out of ``tier``.

    ``bytes`` is its known logical size in that tier, ``None`` when unknown
    (an unknown size is never counted as freeing anything, so such a state is
    never selected). ``can_demote`` means a demotion exists that takes the
    state *out of this accounting pool* (e.g. VRAM to RAM on a discrete system;
    only to disk on a unified one).
    """

    state_id: str
    tier: MemoryTier
    bytes: int | None
    last_accessed_unix_ms: int
    pinned: bool = False
    handoff_live: bool = False
    can_demote: bool = False

    @property
    def eligible(self) -> bool:
        """Not pinned, no live handoff, and a known positive size."""
        return (
            not self.pinned
            and not self.handoff_live
            and self.bytes is not None
            and not isinstance(self.bytes, bool)
            and self.bytes > 0
        )


@dataclass(frozen=True, slots=True)
class ReliefAction:
    state_id: str
    tier: MemoryTier
    kind: ReliefKind
    bytes: int


@dataclass(frozen=True, slots=True)
class ReliefPlan:
    """Planned actions, in execution order.

    ``required_bytes`` is the minimum that must be freed; ``freed_bytes`` the sum
    of the planned sizes; ``projected_used_bytes`` is ``used + need - min(freed,
    used)`` (nothing frees more than is in use); ``feasible`` says the projection is below the
    hard threshold. An infeasible plan has no actions: disturbing states that
    cannot make the request fit would be pure loss.
    """

    actions: tuple[ReliefAction, ...]
    required_bytes: int
    freed_bytes: int
    projected_used_bytes: int
    feasible: bool


@runtime_checkable
class ReliefExecutor(Protocol):
    """Service-side operations a relief pass uses.

    ``demote``/``evict`` return after the backend confirmed the move and raise
    on failure; the executor releases any managed allocation it moves through
    :meth:`MemoryManager.release` so accounting follows the state.
    """

    def relief_candidates(self, tier: MemoryTier) -> Sequence[ReliefCandidate]: ...

    def demote(self, candidate: ReliefCandidate) -> None: ...

    def evict(self, candidate: ReliefCandidate) -> None: ...


def max_used_below_hard(capacity: int, thresholds: Thresholds) -> int:
    """The largest ``used`` with ``100 * used < hard_pct * capacity`` (may be -1)."""
    return -(-thresholds.hard_pct * capacity // 100) - 1


def plan_relief(
    candidates: Sequence[ReliefCandidate],
    need_bytes: int,
    capacity: int,
    used: int,
    thresholds: Thresholds,
    max_actions: int,
) -> ReliefPlan:
    """Plan at most ``max_actions`` moves so ``used - freed + need_bytes`` is below hard.

    Preference order: eligible demotable states least-recently-used first, then
    the remaining eligible states (evictions) least-recently-used first. Pinned,
    handoff-live and unknown-size candidates are never selected; duplicate
    ``state_id`` entries after the first are ignored. Each step takes the most
    preferred candidate that keeps a within-bound completion possible, so a plan
    is found whenever any subset of at most ``max_actions`` eligible candidates
    suffices. Runs in ``O(max_actions * n log n)`` and always terminates.
    """
    if capacity <= 0 or used < 0 or need_bytes < 0 or max_actions < 0:
        raise ValueError("capacity must be positive; used, need and max_actions non-negative")
    required = max(0, used + need_bytes - max_used_below_hard(capacity, thresholds))
    if required == 0:
        return ReliefPlan(
            actions=(), required_bytes=0, freed_bytes=0, projected_used_bytes=used + need_bytes, feasible=True
        )

    seen: set[str] = set()
    eligible: list[ReliefCandidate] = []
    for cand in candidates:
        if cand.state_id in seen:
            continue
        seen.add(cand.state_id)
        if cand.eligible:
            eligible.append(cand)
    order = sorted(
        eligible,
        key=lambda c: (0 if c.can_demote else 1, c.last_accessed_unix_ms, c.state_id),
    )

    def size(c: ReliefCandidate) -> int:
        assert c.bytes is not None  # eligible
        return c.bytes

    def top_sum(values_desc: list[int], m: int) -> int:
        return sum(values_desc[:m])

    infeasible = ReliefPlan(
        actions=(),
        required_bytes=required,
        freed_bytes=0,
        projected_used_bytes=used + need_bytes,
        feasible=False,
    )
    budget = max_actions
    # Nothing can free more than is in use: the request alone must fit below hard.
    if required > used or budget == 0 or top_sum(sorted((size(c) for c in order), reverse=True), budget) < required:
        return infeasible

    remaining = list(order)
    chosen: list[ReliefCandidate] = []
    left = required
    while left > 0:
        values = sorted((size(c) for c in remaining), reverse=True)
        prefix = [0]
        for v in values:
            prefix.append(prefix[-1] + v)
        m = budget - 1

        def rest_top(b: int, m: int = m, values: list[int] = values, prefix: list[int] = prefix) -> int:
            # Sum of the m largest sizes among ``remaining`` with one item of size b removed.
            if m <= 0:
                return 0
            if m >= len(values):
                return prefix[-1] - b
            return prefix[m + 1] - b if b >= values[m - 1] else prefix[m]

        pick = next(i for i, c in enumerate(remaining) if size(c) >= left or rest_top(size(c)) >= left - size(c))
        cand = remaining.pop(pick)
        chosen.append(cand)
        left -= size(cand)
        budget -= 1

    freed = sum(size(c) for c in chosen)
    actions = tuple(
        ReliefAction(c.state_id, c.tier, ReliefKind.DEMOTE if c.can_demote else ReliefKind.EVICT, size(c))
        for c in chosen
    )
    # Execute in preference order: every demotion before any eviction, LRU first.
    rank = {c.state_id: i for i, c in enumerate(order)}
    actions = tuple(sorted(actions, key=lambda a: rank[a.state_id]))
    return ReliefPlan(
        actions=actions,
        required_bytes=required,
        freed_bytes=freed,
        projected_used_bytes=used + need_bytes - min(freed, used),
        feasible=True,
    )

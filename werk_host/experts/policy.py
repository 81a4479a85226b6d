"""The backend-neutral expert policy engine (docs/experts.md).

An adapter that can observe and move MoE experts feeds :class:`ExpertPolicy` what its backend
observed — stable expert ids, tiers, optional sizes, pins and cumulative access counts — and
asks it for the metadata Werk reports and for bounded plans. The engine never discovers MoE
modules and never moves a tensor; the adapter does both. Its contract:

* **Observations are truth.** :meth:`ExpertPolicy.observe` replaces a model's records with what
  the backend reports (tier, size, pin), except for claimed experts, which change only when
  their action commits. A size the backend does not know stays ``None``; the
  engine never estimates one. Ids the backend no longer reports are forgotten.
* **Hotness** decays exponentially with ``half_life_s``; each access adds one. Accesses come as
  :class:`AccessEvent` or as growth of an observed cumulative counter (a counter that went
  down means the backend restarted: its value counts as new accesses).
* **Claims.** :meth:`ExpertPolicy.claim` reserves explicit experts for one action before the
  adapter does backend work; a second claim on any of them is ``conflict`` until the first is
  committed or released. Nothing about an expert changes at claim time: only
  :meth:`Claim.commit`, called after the backend reported success, applies the observed
  outcome and starts each changed expert's transition cooldown. Leaving the ``with`` block
  without committing releases the claim and changes nothing.
* **Plans** are bounded (at most ``limit`` ids) and skip claimed experts and experts whose
  last transition is younger than ``cooldown_s``. :meth:`ExpertPolicy.plan_prefetch` proposes
  the hottest experts outside ``target`` whose known sizes fit ``free_bytes`` together;
  :meth:`ExpertPolicy.plan_relief` proposes the coldest unpinned experts in a tier until
  ``need_bytes`` are freed. An unknown size never fits and never counts as freed, so such an
  expert is never planned.
* **Paging.** :meth:`ExpertPolicy.page` lists records in id order, filtered by model and tier,
  with opaque tamper-evident cursors bound to those filters.
"""

from __future__ import annotations

import math
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace

from werk_host.errors import ErrorCode, WerkError
from werk_host.protocol.experts import ExpertListQuery, ExpertPage, ExpertSummary, ExpertTier
from werk_host.service.cursors import CursorCodec

Clock = Callable[[], int]


def wall_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class PolicySettings:
    """Hotness half-life and transition cooldown (seconds); both positive or zero."""

    half_life_s: float = 60.0
    cooldown_s: float = 5.0

    def __post_init__(self) -> None:
        if not self.half_life_s > 0 or not self.cooldown_s >= 0:
            raise ValueError("half_life_s must be positive and cooldown_s non-negative")


@dataclass(frozen=True)
class ExpertObservation:
    """One expert as the backend observes it now.

    ``accesses`` is the backend's cumulative access count for the expert (``None`` when it
    does not count); ``last_used_unix_ms`` its last use when known."""

    expert_id: str
    model_id: str
    tier: ExpertTier
    bytes: int | None
    pinned: bool = False
    accesses: int | None = None
    last_used_unix_ms: int | None = None


@dataclass(frozen=True)
class AccessEvent:
    """``count`` uses of an expert at ``at_unix_ms``."""

    expert_id: str
    count: int = 1
    at_unix_ms: int | None = None


@dataclass(frozen=True)
class ExpertRecord:
    """What the engine holds for one expert. ``score`` is the hotness at ``scored_at_ms``."""

    expert_id: str
    model_id: str
    tier: ExpertTier
    bytes: int | None
    pinned: bool
    score: float
    scored_at_ms: int
    last_used_unix_ms: int | None
    last_transition_ms: int | None
    seen_accesses: int | None

    def summary(self, hotness: float) -> ExpertSummary:
        return ExpertSummary(
            id=self.expert_id,
            model_id=self.model_id,
            tier=self.tier,
            bytes=self.bytes,
            hotness=hotness,
            pinned=self.pinned,
            last_used_unix_ms=self.last_used_unix_ms,
        )


@dataclass(frozen=True)
class ReliefPlan:
    """Experts to move out of a tier, the bytes that frees, and whether that meets the need."""

    expert_ids: tuple[str, ...]
    freed_bytes: int
    satisfied: bool


class Claim:
    """A reservation of explicit experts for one action (see the module docstring)."""

    def __init__(self, policy: ExpertPolicy, expert_ids: tuple[str, ...]) -> None:
        self._policy = policy
        self.expert_ids = expert_ids
        self.done = False

    def commit(self, observed: Iterable[ExpertObservation]) -> list[ExpertRecord]:
        """Apply the backend's reported outcome for the claimed (and any other reported)
        experts, start cooldowns for those whose tier or pin changed, and release the claim."""
        if self.done:
            raise RuntimeError("this claim was already committed or released")
        try:
            return self._policy._commit(list(observed))
        finally:
            self.release()

    def release(self) -> None:
        if not self.done:
            self.done = True
            self._policy._release(self.expert_ids)


class ExpertPolicy:
    """Records of observed experts with hotness, pins, cooldowns, claims and plans."""

    def __init__(self, settings: PolicySettings | None = None, *, clock: Clock = wall_ms) -> None:
        self.settings = settings or PolicySettings()
        self._clock = clock
        self._records: dict[str, ExpertRecord] = {}
        self._claimed: set[str] = set()
        self._lock = threading.Lock()
        self._cursors = CursorCodec(secrets.token_bytes(32))

    # -- hotness ----------------------------------------------------------------------------
    def _decayed(self, record: ExpertRecord, now: int) -> float:
        elapsed = max(0, now - record.scored_at_ms) / 1000.0
        return record.score * math.pow(0.5, elapsed / self.settings.half_life_s)

    def _bump(self, record: ExpertRecord, count: int, now: int, used_at: int | None) -> ExpertRecord:
        last = record.last_used_unix_ms
        if used_at is not None:
            last = used_at if last is None else max(last, used_at)
        return replace(record, score=self._decayed(record, now) + count, scored_at_ms=now, last_used_unix_ms=last)

    def hotness(self, expert_id: str) -> float:
        with self._lock:
            record = self._records.get(expert_id)
            return self._decayed(record, self._clock()) if record is not None else 0.0

    # -- observations --------------------------------------------------------------------------
    def observe(self, model_id: str, observations: Iterable[ExpertObservation]) -> None:
        """Replace ``model_id``'s records with the backend's observation (module docstring)."""
        with self._lock:
            self._observe(model_id, list(observations), self._clock())

    def _observe(self, model_id: str, observed: list[ExpertObservation], now: int) -> None:
        seen: set[str] = set()
        for obs in observed:
            if obs.model_id != model_id:
                raise ValueError("an observation names another model")
            seen.add(obs.expert_id)
            if obs.expert_id in self._claimed:
                continue  # a claimed expert changes only when its action commits
            self._records[obs.expert_id] = self._merge(self._records.get(obs.expert_id), obs, now)
        for expert_id in [i for i, r in self._records.items() if r.model_id == model_id and i not in seen]:
            if expert_id not in self._claimed:
                del self._records[expert_id]

    def _merge(self, old: ExpertRecord | None, obs: ExpertObservation, now: int) -> ExpertRecord:
        size = obs.bytes if obs.bytes is not None and not isinstance(obs.bytes, bool) and obs.bytes >= 0 else None
        if old is None:
            old = ExpertRecord(obs.expert_id, obs.model_id, obs.tier, size, obs.pinned, 0.0, now, None, None, None)
        record = replace(old, model_id=obs.model_id, tier=obs.tier, bytes=size, pinned=obs.pinned)
        if obs.accesses is not None:
            before = old.seen_accesses
            fresh = obs.accesses - before if before is not None and obs.accesses >= before else obs.accesses
            record = replace(record, seen_accesses=obs.accesses)
            if fresh > 0:
                return self._bump(record, fresh, now, obs.last_used_unix_ms)
        if obs.last_used_unix_ms is not None:
            last = record.last_used_unix_ms
            record = replace(record, last_used_unix_ms=max(last or 0, obs.last_used_unix_ms))
        return record

    def record_access(self, events: Iterable[AccessEvent]) -> None:
        """Count accesses of known experts (events for unknown ids are ignored)."""
        with self._lock:
            now = self._clock()
            for event in events:
                record = self._records.get(event.expert_id)
                if record is not None and event.count > 0:
                    self._records[event.expert_id] = self._bump(record, event.count, now, event.at_unix_ms)

    # -- reading ---------------------------------------------------------------------------------
    def records(self, model_id: str | None = None) -> list[ExpertRecord]:
        """Every record (of ``model_id``), in id order."""
        with self._lock:
            return sorted(
                (r for r in self._records.values() if model_id is None or r.model_id == model_id),
                key=lambda r: r.expert_id,
            )

    def summaries(self, expert_ids: Iterable[str]) -> list[ExpertSummary]:
        """The protocol view of the named (known) experts, hotness decayed to now."""
        with self._lock:
            now = self._clock()
            return [r.summary(self._decayed(r, now)) for i in expert_ids if (r := self._records.get(i)) is not None]

    def page(self, query: ExpertListQuery) -> ExpertPage:
        """One page in id order; the cursor is opaque and bound to the query's filters."""
        scope = f"experts:{query.model_id}:{query.tier}"
        after = self._cursors.decode(query.cursor, scope) if query.cursor else None
        with self._lock:
            now = self._clock()
            matching = sorted(
                (
                    r
                    for r in self._records.values()
                    if (query.model_id is None or r.model_id == query.model_id)
                    and (query.tier is None or r.tier is query.tier)
                    and (after is None or r.expert_id > after)
                ),
                key=lambda r: r.expert_id,
            )
            page = matching[: query.limit]
            summaries = [r.summary(self._decayed(r, now)) for r in page]
        cursor = self._cursors.encode(page[-1].expert_id, scope) if len(matching) > len(page) else None
        return ExpertPage(experts=summaries, next_cursor=cursor)

    # -- claims ----------------------------------------------------------------------------------
    @contextmanager
    def claim(self, expert_ids: Sequence[str]) -> Iterator[Claim]:
        """Reserve ``expert_ids`` (all known, none claimed) for the ``with`` block; raises
        ``not_found`` for an unknown id and ``conflict`` for one claimed by another action."""
        ids = tuple(dict.fromkeys(expert_ids))
        with self._lock:
            unknown = [i for i in ids if i not in self._records]
            if unknown:
                raise WerkError(ErrorCode.NOT_FOUND, "no such expert")
            if any(i in self._claimed for i in ids):
                raise WerkError(ErrorCode.CONFLICT, "another expert action holds one of these experts; retry")
            self._claimed.update(ids)
        claim = Claim(self, ids)
        try:
            yield claim
        finally:
            claim.release()

    def claimed(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._claimed)

    def _release(self, ids: tuple[str, ...]) -> None:
        with self._lock:
            self._claimed.difference_update(ids)

    def _commit(self, observed: list[ExpertObservation]) -> list[ExpertRecord]:
        with self._lock:
            now = self._clock()
            out = []
            for obs in observed:
                old = self._records.get(obs.expert_id)
                record = self._merge(old, obs, now)
                if old is not None and (old.tier is not record.tier or old.pinned != record.pinned):
                    record = replace(record, last_transition_ms=now)
                self._records[obs.expert_id] = record
                out.append(record)
            return out

    # -- plans -----------------------------------------------------------------------------------
    def _movable(self, record: ExpertRecord, now: int) -> bool:
        """Not claimed, not cooling down, and of known size."""
        cooling = (
            record.last_transition_ms is not None and now - record.last_transition_ms < self.settings.cooldown_s * 1000
        )
        return record.expert_id not in self._claimed and not cooling and record.bytes is not None

    def plan_prefetch(self, model_id: str, target: ExpertTier, free_bytes: int, limit: int) -> tuple[str, ...]:
        """The hottest movable experts of ``model_id`` outside ``target`` whose sizes fit
        ``free_bytes`` together (greedy by hotness, then id), at most ``limit``."""
        with self._lock:
            now = self._clock()
            candidates = sorted(
                (
                    (self._decayed(r, now), r)
                    for r in self._records.values()
                    if r.model_id == model_id and r.tier is not target and self._movable(r, now)
                ),
                key=lambda item: (-item[0], item[1].expert_id),
            )
            chosen: list[str] = []
            room = free_bytes
            for _, record in candidates:
                if len(chosen) >= limit:
                    break
                assert record.bytes is not None
                if record.bytes <= room:
                    chosen.append(record.expert_id)
                    room -= record.bytes
            return tuple(chosen)

    def plan_relief(self, model_id: str, tier: ExpertTier, need_bytes: int, limit: int) -> ReliefPlan:
        """The coldest movable unpinned experts of ``model_id`` in ``tier`` (then by id) until
        ``need_bytes`` are freed or ``limit`` is reached."""
        with self._lock:
            now = self._clock()
            candidates = sorted(
                (
                    (self._decayed(r, now), r)
                    for r in self._records.values()
                    if r.model_id == model_id and r.tier is tier and not r.pinned and self._movable(r, now)
                ),
                key=lambda item: (item[0], item[1].expert_id),
            )
            chosen: list[str] = []
            freed = 0
            for _, record in candidates:
                if freed >= need_bytes or len(chosen) >= limit:
                    break
                assert record.bytes is not None
                chosen.append(record.expert_id)
                freed += record.bytes
            return ReliefPlan(tuple(chosen), freed, freed >= need_bytes)

"""Test doubles: injected telemetry, a simulated clock and a recording relief executor."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from werk_host.memory import MemoryManager, MemorySample, MemoryTier, ReliefCandidate, Topology

GIB = 1 << 30


class FakeSource:
    """A pool whose ``used`` bytes a test sets directly; ``fail`` makes sampling raise."""

    def __init__(self, capacity: int | None = 100 * GIB, used: int = 0, topology: Topology | None = None):
        self.capacity = capacity
        self.used = used
        self.fail = False
        self.samples = 0
        self._topology = topology

    def set_pct(self, pct: float) -> None:
        assert self.capacity is not None
        self.used = int(self.capacity * pct / 100)

    def sample(self) -> MemorySample | None:
        self.samples += 1
        if self.fail:
            raise RuntimeError("sensor exploded")
        if self.capacity is None:
            return None
        return MemorySample(self.capacity, self.capacity - self.used, "fake")

    def topology(self) -> Topology:
        return self._topology or Topology.UNKNOWN


class FakeClock:
    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class RecordingExecutor:
    """Frees the candidate's bytes from ``source`` when asked to move it."""

    source: FakeSource
    candidates: list[ReliefCandidate] = field(default_factory=list)
    calls: list[tuple[str, str]] = field(default_factory=list)
    fail_on: set[str] = field(default_factory=set)
    manager: MemoryManager | None = None
    in_flight_seen: list[int] = field(default_factory=list)

    def relief_candidates(self, tier: MemoryTier) -> Sequence[ReliefCandidate]:
        return list(self.candidates)

    def _move(self, kind: str, cand: ReliefCandidate) -> None:
        self.calls.append((kind, cand.state_id))
        if self.manager is not None:
            self.in_flight_seen.append(self.manager.counters()["pressure_actions_in_flight"])
        if cand.state_id in self.fail_on:
            raise RuntimeError("backend refused")
        assert cand.bytes is not None
        self.source.used -= cand.bytes

    def demote(self, candidate: ReliefCandidate) -> None:
        self._move("demote", candidate)

    def evict(self, candidate: ReliefCandidate) -> None:
        self._move("evict", candidate)

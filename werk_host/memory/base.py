"""Value types shared by the memory-accounting package.

``Pressure`` and ``Topology`` are the protocol's own enums (``werk_host.protocol.base`` has no
dependencies); a memory report is a plain ``dict`` of their string values.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from werk_host.protocol.base import Pressure as Pressure
from werk_host.protocol.base import Topology as Topology


class MemoryTier(StrEnum):
    """An accounting tier. Unified topology makes both names one pool."""

    HOST = "host"
    ACCELERATOR = "accelerator"


#: Severity order of the known pressure classes (``unknown`` is not ranked).
PRESSURE_RANK: Final[dict[Pressure, int]] = {
    Pressure.NORMAL: 0,
    Pressure.SOFT: 1,
    Pressure.HARD: 2,
    Pressure.EMERGENCY: 3,
}


class TelemetryError(Exception):
    """A telemetry sample was attempted and failed (counted in ``telemetry_errors``)."""


@dataclass(frozen=True, slots=True)
class MemorySample:
    """One observation of a memory pool.

    ``capacity_bytes`` > 0 and ``0 <= available_bytes <= capacity_bytes``;
    ``source`` is a short public label (never a filesystem path).
    """

    capacity_bytes: int
    available_bytes: int
    source: str

    def __post_init__(self) -> None:
        cap, avail = self.capacity_bytes, self.available_bytes
        if isinstance(cap, bool) or not isinstance(cap, int) or cap <= 0:
            raise TelemetryError("memory sample has no positive integer capacity")
        if isinstance(avail, bool) or not isinstance(avail, int) or not 0 <= avail <= cap:
            raise TelemetryError("memory sample availability is outside [0, capacity]")

    @property
    def used_bytes(self) -> int:
        return self.capacity_bytes - self.available_bytes


@dataclass(frozen=True, slots=True)
class Thresholds:
    """Pressure thresholds as integer percentages of capacity.

    A pool is in class *c* once ``100 * used >= pct(c) * capacity``; it leaves a
    class downwards only when ``100 * used < (pct(c) - hysteresis_pct) * capacity``.
    Integers keep every comparison exact.
    """

    soft_pct: int = 75
    hard_pct: int = 85
    emergency_pct: int = 95
    hysteresis_pct: int = 5

    def __post_init__(self) -> None:
        if not 0 < self.soft_pct < self.hard_pct < self.emergency_pct <= 100:
            raise ValueError("thresholds must satisfy 0 < soft < hard < emergency <= 100")
        if not 0 <= self.hysteresis_pct < self.soft_pct:
            raise ValueError("hysteresis must be in [0, soft)")

    def pct(self, pressure: Pressure) -> int:
        """The entry threshold of a known class (``normal`` is 0)."""
        return {
            Pressure.NORMAL: 0,
            Pressure.SOFT: self.soft_pct,
            Pressure.HARD: self.hard_pct,
            Pressure.EMERGENCY: self.emergency_pct,
        }[pressure]


DEFAULT_THRESHOLDS: Final = Thresholds()

_BY_RANK: Final = (Pressure.NORMAL, Pressure.SOFT, Pressure.HARD, Pressure.EMERGENCY)


def classify_pressure(
    used_bytes: int,
    capacity_bytes: int | None,
    previous: Pressure,
    thresholds: Thresholds = DEFAULT_THRESHOLDS,
) -> Pressure:
    """Pure pressure classification with downward hysteresis.

    Returns ``unknown`` when capacity is unknown. Rising is immediate (the
    highest class whose threshold is reached). Falling from ``previous`` steps
    down one class at a time only while utilization is below that class's
    threshold minus ``hysteresis_pct``. ``previous == unknown`` means no memory.
    """
    if capacity_bytes is None or capacity_bytes <= 0:
        return Pressure.UNKNOWN
    scaled = 100 * max(0, used_bytes)
    raw = 0
    for rank in (3, 2, 1):
        if scaled >= thresholds.pct(_BY_RANK[rank]) * capacity_bytes:
            raw = rank
            break
    prev = PRESSURE_RANK.get(previous, 0)
    if raw >= prev:
        return _BY_RANK[raw]
    held = prev
    while held > raw and scaled < (thresholds.pct(_BY_RANK[held]) - thresholds.hysteresis_pct) * capacity_bytes:
        held -= 1
    return _BY_RANK[max(raw, held)]


def worst_pressure(pressures: list[Pressure]) -> Pressure:
    """The most severe known class, or ``unknown`` when none is known."""
    known = [p for p in pressures if p in PRESSURE_RANK]
    if not known:
        return Pressure.UNKNOWN
    return max(known, key=lambda p: PRESSURE_RANK[p])

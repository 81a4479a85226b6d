"""Pressure classes: every threshold crossing up and down, with 5-point hysteresis."""

from __future__ import annotations

import pytest

from werk_host.memory import (
    MemoryManager,
    Pressure,
    Thresholds,
    Topology,
    classify_pressure,
    worst_pressure,
)

from .fakes import FakeClock, FakeSource

CAP = 10_000  # 1 percentage point == 100 bytes, so every boundary is exact

N, S, H, E, U = Pressure.NORMAL, Pressure.SOFT, Pressure.HARD, Pressure.EMERGENCY, Pressure.UNKNOWN


def pct(p: float) -> int:
    return int(round(p * CAP / 100))


@pytest.mark.parametrize(
    ("used_pct", "expected"),
    [(0, N), (74.99, N), (75, S), (84.99, S), (85, H), (94.99, H), (95, E), (100, E)],
)
def test_rising_from_normal_is_immediate(used_pct: float, expected: Pressure) -> None:
    assert classify_pressure(pct(used_pct), CAP, N) is expected


@pytest.mark.parametrize(
    ("previous", "used_pct", "expected"),
    [
        # soft holds down to 70 %, drops below it
        (S, 74.99, S),
        (S, 70.0, S),
        (S, 69.99, N),
        # hard holds down to 80 %, then soft (which holds to 70 %)
        (H, 84.99, H),
        (H, 80.0, H),
        (H, 79.99, S),
        (H, 70.0, S),
        (H, 69.99, N),
        # emergency holds down to 90 %, then hard (holds to 80 %), ...
        (E, 94.99, E),
        (E, 90.0, E),
        (E, 89.99, H),
        (E, 80.0, H),
        (E, 79.99, S),
        (E, 69.99, N),
        (E, 0.0, N),
        # a rise while holding a lower class still jumps straight up
        (S, 95.0, E),
        (H, 96.0, E),
    ],
)
def test_falling_uses_hysteresis(previous: Pressure, used_pct: float, expected: Pressure) -> None:
    assert classify_pressure(pct(used_pct), CAP, previous) is expected


def test_unknown_capacity_is_unknown_and_unknown_previous_has_no_memory() -> None:
    assert classify_pressure(5, None, E) is U
    assert classify_pressure(pct(80), CAP, U) is S
    assert classify_pressure(pct(72), CAP, U) is N


def test_custom_thresholds_and_validation() -> None:
    th = Thresholds(soft_pct=50, hard_pct=60, emergency_pct=70, hysteresis_pct=0)
    assert classify_pressure(pct(59.99), CAP, H, th) is S
    with pytest.raises(ValueError):
        Thresholds(soft_pct=80, hard_pct=80)
    with pytest.raises(ValueError):
        Thresholds(hysteresis_pct=75)


def test_worst_pressure_ignores_unknown() -> None:
    assert worst_pressure([N, U]) is N
    assert worst_pressure([S, E, H]) is E
    assert worst_pressure([U, U]) is U
    assert worst_pressure([]) is U


def test_manager_walks_every_crossing_with_hysteresis(clock: FakeClock, wall: FakeClock) -> None:
    host = FakeSource(capacity=CAP)
    mgr = MemoryManager(host, None, clock=clock, wall_clock=wall, topology=Topology.DISCRETE)
    path = [
        (50, N),
        (75, S),
        (85, H),
        (95, E),  # up through every threshold
        (91, E),
        (90, E),
        (89, H),  # emergency -> hard below 90
        (81, H),
        (80, H),
        (79, S),  # hard -> soft below 80
        (71, S),
        (70, S),
        (69, N),  # soft -> normal below 70
        (74, N),
        (75, S),
        (96, E),
        (10, N),  # re-rise, big drop
    ]
    for used_pct, expected in path:
        host.set_pct(used_pct)
        snap = mgr.report()
        assert snap["host"]["pressure"] == expected.value, used_pct
        assert snap["overall_pressure"] == expected.value
        assert snap["accelerator"]["pressure"] == "unknown"


def test_manager_pressure_counts_reserved_and_unobserved_managed(manager: MemoryManager, host: FakeSource) -> None:
    cap = host.capacity
    assert cap is not None
    host.set_pct(60)
    manager.reserve("host", cap * 20 // 100)  # 60 % observed + 20 % reserved = 80 % -> soft
    assert manager.report()["host"]["pressure"] == "soft"


def test_unknown_sample_keeps_hysteresis_memory(manager: MemoryManager, host: FakeSource) -> None:
    host.set_pct(96)
    assert manager.report()["host"]["pressure"] == "emergency"
    host.fail = True
    assert manager.report()["host"]["pressure"] == "unknown"
    host.fail = False
    host.set_pct(92)
    assert manager.report()["host"]["pressure"] == "emergency"

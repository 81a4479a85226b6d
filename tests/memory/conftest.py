"""Fixtures for memory-accounting tests."""

from __future__ import annotations

import pytest

from werk_host.memory import MemoryManager, Topology

from .fakes import FakeClock, FakeSource


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def wall() -> FakeClock:
    return FakeClock(1_788_444_000.0)


@pytest.fixture
def host() -> FakeSource:
    return FakeSource()


@pytest.fixture
def accel() -> FakeSource:
    return FakeSource(capacity=None)


@pytest.fixture
def manager(host: FakeSource, accel: FakeSource, clock: FakeClock, wall: FakeClock) -> MemoryManager:
    return MemoryManager(host, accel, clock=clock, wall_clock=wall, topology=Topology.DISCRETE)

"""Fixtures: a real host (in-memory test backend) served by waitress on an ephemeral port."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from werk_host.protocol import CapabilityId, CapabilityStatus
from werk_host.server import Host
from werk_host.testing import hosts
from werk_host.testing.reference import EXPERIMENTAL_STATE, MemoryBackendPlugin

#: A distinctive key, so a leak scan cannot match anything by accident.
LIVE_KEY = "sk-werk-live-5e8c1f0a9b7d3264"


#: The reference backend with every capability the client tests exercise switched on.
LIVE_STATUSES = {
    **EXPERIMENTAL_STATE,
    CapabilityId.REASONING: CapabilityStatus.SUPPORTED,
    CapabilityId.EXPERTS: CapabilityStatus.EXPERIMENTAL,
}


@dataclass
class Live:
    url: str
    host: Host
    plugin: MemoryBackendPlugin


@pytest.fixture
def live(home: Path) -> Iterator[Live]:
    host, plugin = hosts.backend_host(home, api_keys=(LIVE_KEY,), adapter_kwargs={"statuses": LIVE_STATUSES})
    with hosts.running(host) as url:
        yield Live(url, host, plugin)


@pytest.fixture
def live_continuing(home: Path) -> Iterator[Live]:
    """A server whose decode returns a next handoff (the adapter's ``continue`` switch)."""
    host, plugin = hosts.backend_host(home, api_keys=(LIVE_KEY,), adapter_kwargs={"fail": {"continue"}})
    with hosts.running(host) as url:
        yield Live(url, host, plugin)

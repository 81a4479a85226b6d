"""Fixtures: a real host (in-memory test backend) served by waitress on an ephemeral port."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from werk_host.testing import hosts

#: A distinctive key, so a leak scan cannot match anything by accident.
LIVE_KEY = "sk-werk-live-5e8c1f0a9b7d3264"


def _backend_host(home: Path, **kwargs: Any) -> tuple[Any, Any]:
    # the helper was first named ``test_backend_host``; accept either name
    factory: Any = getattr(hosts, "backend_host", None) or getattr(hosts, "test_backend_host", None)
    return factory(home, **kwargs)  # type: ignore[no-any-return]


@dataclass
class Live:
    url: str
    host: Any
    plugin: Any


@pytest.fixture
def live(home: Path) -> Iterator[Live]:
    host, plugin = _backend_host(home, api_keys=(LIVE_KEY,))
    with hosts.running(host) as url:
        yield Live(url, host, plugin)


@pytest.fixture
def live_continuing(home: Path) -> Iterator[Live]:
    """A server whose decode returns a next handoff (the adapter's ``continue`` switch)."""
    host, plugin = _backend_host(home, api_keys=(LIVE_KEY,), adapter_kwargs={"fail": {"continue"}})
    with hosts.running(host) as url:
        yield Live(url, host, plugin)

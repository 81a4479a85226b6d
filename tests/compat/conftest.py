"""A host around the reference backend, keyed, for the compatibility routes. The key is an
operator's (werk_host/service/principals.py), so Ollama's residency idioms act as in Ollama;
tests/test_residency_rules.py covers keys that are not."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import falcon.testing
import pytest

from werk_host.server import Host
from werk_host.testing.hosts import backend_host, running
from werk_host.testing.reference import MemoryBackendPlugin

KEY = "sk-werk-compat-test-0123456789"


@pytest.fixture
def host(tmp_path: Path) -> Iterator[tuple[Host, MemoryBackendPlugin]]:
    home = tmp_path / "home"
    home.mkdir()
    built, plugin = backend_host(home, operator_api_keys=(KEY,))
    try:
        yield built, plugin
    finally:
        built.close()


@pytest.fixture
def client(host: tuple[Host, MemoryBackendPlugin]) -> falcon.testing.TestClient:
    """Falcon's in-process client, sending no key unless a test passes one."""
    return falcon.testing.TestClient(host[0].app)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[str]:
    """The same kind of host on a real waitress server; yields its base URL."""
    home = tmp_path / "served"
    home.mkdir()
    built, _ = backend_host(home, operator_api_keys=(KEY,))
    with running(built) as url:
        yield url

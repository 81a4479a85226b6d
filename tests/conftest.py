from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import falcon.testing
import pytest

from werk_host.server import Host
from werk_host.testing.hosts import backend_host, make_host
from werk_host.testing.reference import MemoryBackendPlugin

KEY = "sk-werk-test-0123456789"


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "werk-home"
    path.mkdir()
    return path


@pytest.fixture
def bare_host(home: Path) -> Iterator[Host]:
    host = make_host(home, api_keys=(KEY,))
    yield host
    host.close()


@pytest.fixture
def bare_client(bare_host: Host) -> falcon.testing.TestClient:
    return falcon.testing.TestClient(bare_host.app, headers={"Authorization": f"Bearer {KEY}"})


@pytest.fixture
def test_host(home: Path) -> Iterator[tuple[Host, MemoryBackendPlugin]]:
    host, plugin = backend_host(home, api_keys=(KEY,))
    yield host, plugin
    host.close()


@pytest.fixture
def client(test_host: tuple[Host, MemoryBackendPlugin]) -> falcon.testing.TestClient:
    return falcon.testing.TestClient(test_host[0].app, headers={"Authorization": f"Bearer {KEY}"})

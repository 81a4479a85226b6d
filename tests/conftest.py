from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import falcon.testing
import pytest

from werk_host.server import Host
from werk_host.testing.hosts import backend_host, make_host
from werk_host.testing.reference import MemoryBackendPlugin

KEY = "sk-werk-test-0123456789"


@pytest.fixture(autouse=True, scope="session")
def _simulated_requests_name_localhost() -> Iterator[None]:
    """falcon's TestClient sends ``Host: falconframework.org``, a name the host refuses
    (docs/operations.md, "Browser safety"); simulated requests name ``localhost`` instead, as a
    client on this machine does (a test may still pass ``host=``)."""
    simulate = falcon.testing.TestClient.simulate_request

    def simulate_request(self: falcon.testing.TestClient, *args: object, **kwargs: object) -> object:
        kwargs.setdefault("host", "localhost")
        return simulate(self, *args, **kwargs)  # type: ignore[arg-type]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(falcon.testing.TestClient, "simulate_request", simulate_request)
        yield


@pytest.fixture(scope="session")
def llama_server() -> str:
    """The real llama-server binary (``WERK_LLAMA_SERVER``, else the plugin's cached build);
    skips, with the reason, where there is none."""
    found = os.environ.get("WERK_LLAMA_SERVER")
    if found and os.access(found, os.X_OK):
        return found
    try:
        from werk_llamacpp.binary import LlamaServerNotFound, find_llama_server
    except ImportError:
        pytest.skip("the llama.cpp plugin is not installed")
    try:
        return str(find_llama_server(use_path=False))
    except LlamaServerNotFound:
        pytest.skip("no llama-server binary: set WERK_LLAMA_SERVER or run scripts/build-llama-server.sh")


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

"""Discovery does not ask the backend for the same evidence on every request.

``GET /werk/v1/capabilities`` and every capability gate ask the adapter's own report once per
request (it follows probes at once), while the backend's resolved plan (``runtime.placement``),
which may cost a request to the backend, is reused per backend process for a short time and
asked afresh as soon as the process changes (``werk_host.service.capabilities``). Observed on
the reference plugin by counting its hook calls.
"""

from __future__ import annotations

import functools
from typing import Any

import falcon.testing
import pytest

import werk_host.service.capabilities as capabilities_module
from tests.conftest import KEY
from werk_host.testing.hosts import backend_host
from werk_host.testing.reference import MemoryBackendPlugin


@pytest.fixture
def counted(home: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[falcon.testing.TestClient, Any, dict[str, int]]:
    calls = {"plan": 0, "capabilities": 0}
    real_plan, real_caps = MemoryBackendPlugin.werk_deployment_plan, MemoryBackendPlugin.werk_capabilities

    @functools.wraps(real_plan)  # keeps the hook implementation marker
    def plan(self: MemoryBackendPlugin, adapter: Any) -> Any:
        calls["plan"] += 1
        return real_plan(self, adapter)

    @functools.wraps(real_caps)
    def capabilities(self: MemoryBackendPlugin, adapter: Any) -> Any:
        calls["capabilities"] += 1
        return real_caps(self, adapter)

    monkeypatch.setattr(capabilities_module, "EVIDENCE_TTL_S", 3600.0)  # no expiry within the test
    monkeypatch.setattr(MemoryBackendPlugin, "werk_deployment_plan", plan)
    monkeypatch.setattr(MemoryBackendPlugin, "werk_capabilities", capabilities)
    host, _ = backend_host(home, api_keys=(KEY,))
    client = falcon.testing.TestClient(host.app, headers={"Authorization": f"Bearer {KEY}"})
    try:
        yield client, host, calls
    finally:
        host.close()


def _placement(client: falcon.testing.TestClient) -> str:
    result = client.simulate_get("/werk/v1/capabilities")
    assert result.status_code == 200, result.text
    (placement,) = [c for c in result.json["data"] if c["id"] == "runtime.placement"]
    status: str = placement["status"]
    return status


def test_the_plan_is_asked_once_per_process_and_the_report_once_per_request(counted: Any) -> None:
    client, host, calls = counted
    for _ in range(20):
        assert _placement(client) == "supported"
    assert calls["capabilities"] == 20  # the adapter's own report: once per request, never reused
    assert calls["plan"] == 1

    host.runtime.adapter.restart()  # a new backend process: a new identity, its plan asked at once
    assert _placement(client) == "supported"
    assert calls["plan"] == 2


def test_a_gate_asks_the_report_once_and_never_the_plan(counted: Any) -> None:
    client, _, calls = counted
    result = client.simulate_post("/werk/v1/chat/count_tokens", json={"messages": [{"role": "user", "content": "hi"}]})
    assert result.status_code == 200, result.text
    assert (calls["capabilities"], calls["plan"]) == (1, 0)


def test_an_expired_plan_is_asked_again(home: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(capabilities_module, "EVIDENCE_TTL_S", 0.0)
    asked: list[object] = []
    real_plan = MemoryBackendPlugin.werk_deployment_plan

    @functools.wraps(real_plan)
    def plan(self: MemoryBackendPlugin, adapter: Any) -> Any:
        asked.append(adapter)
        return real_plan(self, adapter)

    monkeypatch.setattr(MemoryBackendPlugin, "werk_deployment_plan", plan)
    host, _ = backend_host(home, api_keys=(KEY,))
    try:
        client = falcon.testing.TestClient(host.app, headers={"Authorization": f"Bearer {KEY}"})
        for _ in range(3):
            assert _placement(client) == "supported"
        assert len(asked) == 3
    finally:
        host.close()

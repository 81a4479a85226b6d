"""Discovery does not ask the backend for the same evidence on every request.

``GET /werk/v1/capabilities`` and every capability gate reuse the adapter's own report, and the
backend's resolved plan (``runtime.placement``, which may cost a request to the backend), per
backend process for a short time: the report is asked afresh as soon as an operation hook that
may change evidence ran (a prefill), both as soon as the process changes, and both when the
time is up (``werk_host.service.capabilities``). Observed on the reference plugin by counting
its hook calls.
"""

from __future__ import annotations

import functools
from typing import Any

import falcon.testing
import pytest

import werk_host.service.capabilities as capabilities_module
from tests.conftest import KEY
from werk_host.protocol import CapabilityId, CapabilityStatus
from werk_host.testing.hosts import backend_host
from werk_host.testing.reference import MemoryAdapter


@pytest.fixture
def counted(home: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[falcon.testing.TestClient, Any, dict[str, int]]:
    calls = {"plan": 0, "capabilities": 0}
    real_plan, real_caps = MemoryAdapter.deployment_plan, MemoryAdapter.capabilities

    @functools.wraps(real_plan)  # keeps the hook implementation marker
    def plan(self: MemoryAdapter) -> Any:
        calls["plan"] += 1
        return real_plan(self)

    @functools.wraps(real_caps)
    def capabilities(self: MemoryAdapter) -> Any:
        calls["capabilities"] += 1
        return real_caps(self)

    monkeypatch.setattr(capabilities_module, "EVIDENCE_TTL_S", 3600.0)  # no expiry within the test
    monkeypatch.setattr(MemoryAdapter, "deployment_plan", plan)
    monkeypatch.setattr(MemoryAdapter, "capabilities", capabilities)
    host, _ = backend_host(home, api_keys=(KEY,))
    client = falcon.testing.TestClient(host.app, headers={"Authorization": f"Bearer {KEY}"})
    try:
        yield client, host, calls
    finally:
        host.close()


def _status(client: falcon.testing.TestClient, cap_id: str) -> str:
    result = client.simulate_get("/werk/v1/capabilities")
    assert result.status_code == 200, result.text
    (found,) = [c for c in result.json["data"] if c["id"] == cap_id]
    status: str = found["status"]
    return status


def _placement(client: falcon.testing.TestClient) -> str:
    return _status(client, "runtime.placement")


def test_the_report_and_plan_are_asked_once_per_process_while_nothing_ran(counted: Any) -> None:
    client, host, calls = counted
    for _ in range(20):
        assert _placement(client) == "supported"
    assert (calls["capabilities"], calls["plan"]) == (1, 1)

    host.fleet.adapter.restart()  # a new backend process: a new identity, both asked at once
    assert _placement(client) == "supported"
    assert (calls["capabilities"], calls["plan"]) == (2, 2)


def test_an_operation_makes_the_next_request_ask_the_report_again(counted: Any) -> None:
    client, _, calls = counted
    assert _placement(client) == "supported"
    count = client.simulate_post("/werk/v1/chat/count_tokens", json={"messages": [{"role": "user", "content": "x"}]})
    assert count.status_code == 200, count.text  # an observing hook: the report is reused
    assert calls["capabilities"] == 1
    prefill = client.simulate_post(
        "/werk/v1/prefill",
        json={"model_id": "tiny", "input": {"type": "text", "text": "hello"}, "allow_experimental": True},
    )
    assert prefill.status_code == 200, prefill.text
    asked = calls["capabilities"]  # the prefill's own gates come before the hook runs
    assert _placement(client) == "supported"
    assert calls["capabilities"] == asked + 1  # the prefill may have changed the evidence
    assert calls["plan"] == 1  # the plan follows the process, not its operations


def test_a_changed_report_shows_after_an_operation(counted: Any) -> None:
    client, host, _ = counted
    adapter = host.fleet.adapter
    assert _status(client, "runtime.pd.prefill") == "experimental"
    adapter.statuses[CapabilityId.PD_PREFILL] = CapabilityStatus.UNAVAILABLE  # evidence moves by itself
    assert _status(client, "runtime.pd.prefill") == "experimental"  # reused within the TTL
    prefill = client.simulate_post(
        "/werk/v1/prefill",
        json={"model_id": "tiny", "input": {"type": "text", "text": "hi"}, "allow_experimental": True},
    )
    # the gate reused the report (the adapter itself is what fails closed on real evidence)
    assert prefill.status_code == 200, prefill.text
    assert _status(client, "runtime.pd.prefill") == "unavailable"  # asked again after it


def test_a_gate_asks_the_report_once_and_never_the_plan(counted: Any) -> None:
    client, _, calls = counted
    result = client.simulate_post("/werk/v1/chat/count_tokens", json={"messages": [{"role": "user", "content": "hi"}]})
    assert result.status_code == 200, result.text
    assert (calls["capabilities"], calls["plan"]) == (1, 0)


def test_an_expired_plan_is_asked_again(home: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(capabilities_module, "EVIDENCE_TTL_S", 0.0)
    asked: list[object] = []
    real_plan = MemoryAdapter.deployment_plan

    @functools.wraps(real_plan)
    def plan(self: MemoryAdapter) -> Any:
        asked.append(self)
        return real_plan(self)

    monkeypatch.setattr(MemoryAdapter, "deployment_plan", plan)
    host, _ = backend_host(home, api_keys=(KEY,))
    try:
        client = falcon.testing.TestClient(host.app, headers={"Authorization": f"Bearer {KEY}"})
        for _ in range(3):
            assert _placement(client) == "supported"
        assert len(asked) == 3
    finally:
        host.close()

"""A state listing does not ask the backend for its compatibility key on every request.

``GET /werk/v1/states`` answers a page the store kept (nothing on it changed) without asking the
compatibility keys again while the capability evidence rules hold: same backend process, no operation
hook since, within the evidence TTL window (``werk_host.service.states``, ``list_states``). Any of
those changing asks again, so a restarted backend shows its states' new ``reusable`` at once.
Observed on the reference plugin by counting its hook calls.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import falcon.testing
import pytest

import werk_host.service.capabilities as capabilities_module
from tests.conftest import KEY
from werk_host.testing.hosts import backend_host
from werk_host.testing.reference import MemoryAdapter

PREFILL = {"model_id": "tiny", "input": {"type": "text", "text": "hello"}, "allow_experimental": True}


def listed(client: falcon.testing.TestClient) -> list[dict[str, Any]]:
    result = client.simulate_get("/werk/v1/states", params={"limit": "100"})
    assert result.status_code == 200, result.text
    states: list[dict[str, Any]] = result.json["data"]["states"]
    return states


def served(home: Any, monkeypatch: pytest.MonkeyPatch, ttl_s: float) -> Iterator[tuple[Any, Any, list[str]]]:
    asked: list[str] = []
    real = MemoryAdapter.compat_key

    @functools.wraps(real)  # keeps the hook implementation marker
    def compat_key(self: MemoryAdapter, model_id: str) -> dict[str, str]:
        asked.append(model_id)
        return real(self, model_id)

    monkeypatch.setattr(capabilities_module, "EVIDENCE_TTL_S", ttl_s)
    monkeypatch.setattr(MemoryAdapter, "compat_key", compat_key)
    host, _ = backend_host(home, api_keys=(KEY,))
    client = falcon.testing.TestClient(host.app, headers={"Authorization": f"Bearer {KEY}"})
    try:
        prefill = client.simulate_post("/werk/v1/prefill", json={**PREFILL, "policy": {"mode": "disk"}})
        assert prefill.status_code == 200, prefill.text
        yield client, host, asked
    finally:
        host.close()


@pytest.fixture
def kept(home: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, Any, list[str]]]:
    yield from served(home, monkeypatch, 3600.0)  # no expiry within the test


def test_a_kept_page_does_not_ask_again_until_the_process_changes(kept: Any) -> None:
    client, host, asked = kept
    (state,) = listed(client)
    assert state["reusable"] is True
    first = len(asked)
    for _ in range(10):
        assert listed(client) == [state]
    assert len(asked) == first  # nothing changed: not asked again

    host.fleet.adapter.restart()  # a new process: its compatibility key differs from the state's
    (after,) = listed(client)
    assert len(asked) == first + 1
    assert after["id"] == state["id"] and after["reusable"] is False  # shown at once


def test_an_operation_makes_the_next_listing_ask_again(kept: Any) -> None:
    client, _, asked = kept
    listed(client)
    first = len(asked)
    count = client.simulate_post("/werk/v1/chat/count_tokens", json={"messages": [{"role": "user", "content": "x"}]})
    assert count.status_code == 200, count.text  # an observing hook: nothing asked again
    listed(client)
    assert len(asked) == first
    chat = client.simulate_post(
        "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    )
    assert chat.status_code == 200, chat.text  # an operation hook ran; the store did not change
    assert len(listed(client)) == 1
    assert len(asked) == first + 1


def test_without_a_ttl_every_listing_asks(home: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    for client, _, asked in served(home, monkeypatch, 0.0):
        listed(client)
        first = len(asked)
        for _ in range(3):
            listed(client)
        assert len(asked) == first + 3

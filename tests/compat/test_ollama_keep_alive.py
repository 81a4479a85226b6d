"""Ollama's per-request ``keep_alive`` on deployment residency (docs/compat.md, "keep_alive and
residency"), over the reference backend: a request's value replaces the profile's idle time of
the instance that served it, until the instance stops or another Ollama request asks again. The
key is an operator's; tests/test_residency_rules.py covers clients that are not operators.

Idle time is judged at chosen instants (``Instance.stop_if_idle(now=...)``, a monotonic clock
reading), so no test waits for the profile's minute to pass; the keep-alive sweeper itself is
exercised by the one test that asks for a short time and waits for the stop.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import falcon.testing
import pytest

from tests.compat.conftest import KEY
from werk_host.deployments.instances import Instance
from werk_host.server import Host
from werk_host.testing.hosts import backend_host

AUTH = {"Authorization": f"Bearer {KEY}"}
MESSAGES = [{"role": "user", "content": "name three colours"}]
SHORT = {"num_predict": 4}
#: The profile keeps an idle instance for a minute.
PROFILE_KEEP_S = 60.0


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Host]:
    home = tmp_path / "home"
    home.mkdir()
    profile = tmp_path / "deployments.toml"
    profile.write_text('[[instance]]\nid = "tiny"\nmodel = "tiny"\npreload = true\nkeep_alive = "1m"\n')
    built, _ = backend_host(home, operator_api_keys=(KEY,), profile=profile)
    try:
        yield built
    finally:
        built.close()


@pytest.fixture
def client(host: Host) -> falcon.testing.TestClient:
    return falcon.testing.TestClient(host.app)


def _instance(host: Host) -> Instance:
    assert host.fleet.deployments is not None
    return host.fleet.deployments.instances["tiny"]


def _post(client: falcon.testing.TestClient, path: str, body: dict[str, Any]) -> falcon.testing.Result:
    result = client.simulate_post(path, json=body, headers=AUTH)
    assert result.status_code == 200, result.text
    return result


def _chat(client: falcon.testing.TestClient, **extra: Any) -> falcon.testing.Result:
    return _post(client, "/api/chat", {"model": "tiny", "messages": MESSAGES, "options": SHORT, **extra})


def _inventory(client: falcon.testing.TestClient) -> dict[str, Any]:
    inventory: dict[str, Any] = client.simulate_get("/werk/v1/deployments", headers=AUTH).json["data"]["inventory"][0]
    return inventory


def _expires_at_s(client: falcon.testing.TestClient) -> float | None:
    models = client.simulate_get("/api/ps", headers=AUTH).json["models"]
    assert [m["name"] for m in models] == ["tiny"]
    stamp = models[0]["expires_at"]
    return None if stamp is None else datetime.fromisoformat(stamp).timestamp()


def _state(client: falcon.testing.TestClient) -> str:
    state: str = _inventory(client)["state"]
    return state


def test_a_longer_keep_alive_keeps_the_instance_past_the_profiles(
    client: falcon.testing.TestClient, host: Host
) -> None:
    instance = _instance(host)
    assert _inventory(client)["keep_alive_seconds"] == PROFILE_KEEP_S
    _chat(client, stream=False, keep_alive="10m")
    asked = time.monotonic()
    inventory = _inventory(client)
    assert inventory["keep_alive_seconds"] == 600.0
    # /api/ps says when it expires: ten minutes after the last use
    expires = _expires_at_s(client)
    assert expires == pytest.approx(inventory["last_used_unix_ms"] / 1000 + 600, abs=0.002)
    # past the profile's minute it stays; past the requested ten minutes it stops
    assert not instance.stop_if_idle(now=asked + PROFILE_KEEP_S + 1)
    assert _state(client) == "ready"
    assert instance.stop_if_idle(now=asked + 601)
    assert _state(client) == "cold"
    # stopped, the instance forgets the request's setting: the next start has the profile's
    _chat(client, stream=False)
    assert _inventory(client)["keep_alive_seconds"] == PROFILE_KEEP_S


def test_a_streamed_request_and_the_load_idiom_set_it_too(client: falcon.testing.TestClient, host: Host) -> None:
    instance = _instance(host)
    streamed = _chat(client, keep_alive=7200)
    assert json.loads(streamed.text.splitlines()[-1])["done"] is True
    assert _inventory(client)["keep_alive_seconds"] == 7200.0
    assert not instance.stop_if_idle(now=time.monotonic() + 3600)
    # Ollama's load idiom (no messages) holds the instance as well
    load = _post(client, "/api/generate", {"model": "tiny", "keep_alive": "2h30m"})
    assert load.json["done_reason"] == "load"
    assert _inventory(client)["keep_alive_seconds"] == 9000.0


def test_negative_keeps_it_loaded_and_no_keep_alive_returns_to_the_profile(
    client: falcon.testing.TestClient, host: Host
) -> None:
    instance = _instance(host)
    _chat(client, stream=False, keep_alive=-1)
    assert _inventory(client)["keep_alive_seconds"] is None  # forever
    assert _expires_at_s(client) is None
    assert not instance.stop_if_idle(now=time.monotonic() + 10 * 365 * 86400)
    assert _state(client) == "ready"
    # an Ollama request without keep_alive: the profile's idle time again, as Ollama's default
    _chat(client, stream=False)
    assert _inventory(client)["keep_alive_seconds"] == PROFILE_KEEP_S
    assert instance.stop_if_idle(now=time.monotonic() + PROFILE_KEEP_S + 1)


def test_a_shorter_keep_alive_stops_it_sooner_and_v1_leaves_the_setting(
    client: falcon.testing.TestClient, host: Host
) -> None:
    instance = _instance(host)
    _chat(client, stream=False, keep_alive="1s")
    # a /v1 request knows no keep_alive: it counts as a use and keeps the request's setting
    v1 = client.simulate_post(
        "/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES, "max_tokens": 4}, headers=AUTH
    )
    assert v1.status_code == 200, v1.text
    assert _inventory(client)["keep_alive_seconds"] == 1.0
    # the keep-alive sweeper stops it, although the profile would keep it for a minute
    deadline = time.monotonic() + 60
    while _state(client) != "cold" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _state(client) == "cold"
    assert client.simulate_get("/api/ps", headers=AUTH).json["models"] == []
    assert not instance.stop_if_idle()


def test_a_failed_request_and_keep_alive_zero(client: falcon.testing.TestClient, host: Host) -> None:
    # a request the model cannot serve does not touch residency
    refused = client.simulate_post(
        "/api/chat",
        json={
            "model": "tiny",
            "messages": [{"role": "user", "content": "word " * 70}],  # more than the context holds
            "keep_alive": "1h",
            "options": {"num_predict": 8},
        },
        headers=AUTH,
    )
    assert refused.status_code == 400, refused.text
    assert _inventory(client)["keep_alive_seconds"] == PROFILE_KEEP_S
    # keep_alive 0 still unloads right after the answer
    _chat(client, stream=False, keep_alive=0)
    assert _state(client) == "cold"


def test_keep_alive_zero_waits_for_the_other_requests_on_the_instance(
    client: falcon.testing.TestClient, host: Host
) -> None:
    instance = _instance(host)
    instance.enter()  # another request in flight on the instance (as /v1 holds it)
    try:
        _chat(client, stream=False, keep_alive=0)
        assert _state(client) == "ready"  # not under the other request
    finally:
        instance.leave()
    assert _state(client) == "cold"  # once that request is done too


@pytest.mark.parametrize("path", ["/api/chat", "/api/generate"])
def test_the_unload_idiom_under_a_stream_unloads_when_the_stream_ends(
    client: falcon.testing.TestClient, host: Host, path: str
) -> None:
    """Issue 48, item 5: an operator's ``keep_alive: 0`` while another request streams on the
    instance answers ``unload`` and does it once that request ends, not never."""
    instance = _instance(host)
    instance.enter()  # a stream in flight on the instance (as /v1 holds it)
    try:
        answer = _post(client, path, {"model": "tiny", "keep_alive": 0})
        assert answer.json["done_reason"] == "unload"
        assert _state(client) == "ready"  # not under the stream
        assert _inventory(client)["keep_alive_seconds"] == 0  # what is in effect is reported
    finally:
        instance.leave()
    for _ in range(100):  # the keep-alive sweeper stops it once idle
        if _state(client) == "cold":
            break
        time.sleep(0.05)
    assert _state(client) == "cold"

"""A ``swap`` group over real llama-server children (docs/deployments.md, "Residency limits"):
requests racing a swap are all answered (an unload never hits an instance with a request in
flight: a killed child would fail its request), at most one member's llama-server runs when the
race is over, and an instance holding a live handoff is waited for, not unloaded (its handoff
still decodes), while the other member's request ends in a retryable 503 with ``Retry-After``.
"""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psutil  # type: ignore[import-untyped]
import pytest
from werk_llamacpp.testing.hosts import profile_host
from werk_llamacpp.testing.testmodel import generate_model

from werk_host.testing.api import Api
from werk_host.testing.host import Host
from werk_host.testing.hosts import running

pytestmark = pytest.mark.llamaserver
KEY = "sk-werk-llama-swap-0123456789"
OPERATOR = "sk-werk-llama-swap-op-0123456789"
PROFILE = (
    '[[instance]]\nid = "a"\nmodel = "tiny"\n'
    '[[instance]]\nid = "b"\nmodel = "tiny"\n'
    '[group.pair]\nmembers = ["a", "b"]\nswap = true\n'
)


def _serve(tmp_path: Path, llama_server_path: Path, residency: str) -> Iterator[tuple[Host, str]]:
    model = generate_model(tmp_path / "tiny.gguf")
    host = profile_host(
        tmp_path / "home", {"tiny": model}, PROFILE + residency, llama_server_path,
        api_keys=(KEY,), operator_api_keys=(OPERATOR,),
    )  # fmt: skip
    with running(host) as url:
        yield host, url


@pytest.fixture
def served(tmp_path: Path, llama_server_path: Path) -> Iterator[tuple[Host, str]]:
    yield from _serve(tmp_path, llama_server_path, "")


@pytest.fixture
def impatient(tmp_path: Path, llama_server_path: Path) -> Iterator[tuple[Host, str]]:
    yield from _serve(tmp_path, llama_server_path, "[residency]\nload_timeout = 1\n")


def _chat(url: str, model: str) -> tuple[int, dict[str, str], Any]:
    body = {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=300)
    try:
        headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
        conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers=headers)
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), json.loads(resp.read())
    finally:
        conn.close()


def _inventory(api: Api) -> dict[str, dict[str, Any]]:
    status, doc = api.get("/werk/v1/deployments")
    assert status == 200, doc
    return {i["id"]: i for i in doc["data"]["inventory"]}


def _children() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if "llama-server" in " ".join(p.cmdline()[:1])]


def test_requests_racing_a_swap_are_all_answered_and_one_member_stays(served: tuple[Host, str]) -> None:
    _, url = served
    results: list[tuple[str, int, Any]] = []
    lock = threading.Lock()

    def ask(model: str) -> None:
        for _ in range(3):
            status, _, body = _chat(url, model)
            with lock:
                results.append((model, status, body))

    threads = [threading.Thread(target=ask, args=(m,)) for m in ("a", "b", "a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 12 and all(status == 200 for _, status, _ in results), results
    inventory = _inventory(Api(url, KEY))
    loaded = [i for i, v in inventory.items() if v["state"] == "ready"]
    assert len(loaded) == 1, inventory
    assert len(_children()) == 1
    operator = Api(url, OPERATOR)
    swaps = [
        line for name in ("a", "b") for line in operator.get(f"/werk/v1/deployments/{name}/logs")[1]["data"]["lines"]
    ]
    assert any("group pair loads one member at a time" in line for line in swaps), swaps


def test_a_member_with_a_live_handoff_is_waited_for_not_unloaded(impatient: tuple[Host, str]) -> None:
    _, url = impatient
    api = Api(url, KEY)
    body = {"model_id": "tiny", "input": {"type": "text", "text": "a b c"}, "allow_experimental": True}
    status, doc = api.post("/werk/v1/prefill", {**body, "policy": {"mode": "ephemeral", "reuse": "disabled"}})
    assert status == 200, doc  # on the default instance, a
    pid = _inventory(api)["a"]["pid"]
    status, headers, answer = _chat(url, "b")
    assert status == 503 and headers.get("Retry-After", "").isdigit(), answer
    assert "waiting for a to go idle" in answer["error"]["message"], answer
    inventory = _inventory(api)
    assert inventory["a"]["state"] == "ready" and inventory["a"]["pid"] == pid and inventory["b"]["state"] == "cold"
    decode = {"handoff": doc["data"]["handoff"], "max_tokens": 2, "allow_experimental": True}
    status, decoded = api.post("/werk/v1/decode", decode)
    assert status == 200, decoded  # not 410: a's llama-server is the same one
    status, _, answer = _chat(url, "b")
    assert status == 200, answer
    inventory = _inventory(api)
    assert inventory["a"]["state"] == "cold" and inventory["b"]["state"] == "ready"

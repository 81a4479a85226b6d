"""Prefills on a real llama-server run inside the host's inference gate (docs/operations.md,
"Inference concurrency"): while they wait for the state slot they never take the last worker
threads.

The test holds the adapter's ``slot_lock`` (the state slot's lock, which every prefill takes),
so the prefills it sends wait inside the real backend call until it lets go; every socket read
has a timeout and the lock is always given back, so a regression fails in bounded time.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from werk_llamacpp.adapter import LlamaCppAdapter

from werk_host.plugin import HostConfig, ModelManifest, ServerLimits
from werk_host.testing.host import Host, ModelRegistry, build_host
from werk_host.testing.hosts import running

pytestmark = pytest.mark.llamaserver

KEYS = (
    "sk-werk-gate-llama-one-01",
    "sk-werk-gate-llama-two-02",
    "sk-werk-gate-llama-three3",
    "sk-werk-gate-llama-four-4",
)
#: Socket timeout of every request: a control route slower than this counts as starved.
TIMEOUT_S = 10.0
HOST_BOUND = 6  # of ServerLimits(threads=8): 8 - max(2, 8 // 4)


@dataclass
class Env:
    host: Host
    port: int

    @property
    def adapter(self) -> LlamaCppAdapter:
        adapter = self.host.fleet.adapter
        assert isinstance(adapter, LlamaCppAdapter)
        return adapter

    def send(self, method: str, path: str, key: str, body: Any = None) -> http.client.HTTPConnection:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=TIMEOUT_S)
        headers = {"Authorization": f"Bearer {key}", "X-Werk-Protocol-Version": "1.0"}
        data = None
        if body is not None:
            headers["Content-Type"] = "application/json"
            data = json.dumps(body).encode()
        conn.request(method, path, body=data, headers=headers)
        return conn

    def prefill(self, key: str, text: str) -> http.client.HTTPConnection:
        body = {"model_id": "tiny", "input": {"type": "text", "text": text}, "allow_experimental": True}
        return self.send("POST", "/werk/v1/prefill", key, body)


def answer(conn: http.client.HTTPConnection) -> tuple[int, dict[str, str], Any]:
    try:
        response = conn.getresponse()
        headers = {k.lower(): v for k, v in response.getheaders()}
        raw = response.read()
        return response.status, headers, json.loads(raw) if "json" in headers.get("content-type", "") else raw
    finally:
        conn.close()


@pytest.fixture
def env(tmp_path: Path, llama_server_path: Path, tiny_model: Path) -> Iterator[Env]:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    ModelRegistry(home).add(
        ModelManifest.from_paths("tiny", [tiny_model], backend="llama.cpp", params={"max_output_tokens": 64})
    )
    config = HostConfig(
        home=home,
        api_keys=KEYS,
        model="tiny",
        limits=ServerLimits(threads=8, inference_slots=HOST_BOUND),
        backend_options={"llamacpp": {"llama_server": str(llama_server_path), "parallel": 2, "ctx": 2048}},
    )
    host = build_host(config)
    with running(host) as base:
        yield Env(host, int(base.rsplit(":", 1)[1]))


def test_prefills_waiting_for_the_state_slot_leave_control_routes_answering(env: Env) -> None:
    """12 prefills from four keys on an 8-thread host while the state slot is held: six wait
    inside the backend, six are refused at once (503 ``unavailable`` with ``Retry-After``), and
    every control route answers meanwhile; once the slot is free the six succeed. Ungated, the
    prefills take all 8 threads and the control routes time out."""
    status, _, body = answer(env.prefill(KEYS[0], "the adapter starts and is probed"))
    assert status == 200, body
    lock = env.adapter.slot_lock
    assert lock.acquire(timeout=TIMEOUT_S)
    locked = True
    try:
        calls = [env.prefill(KEYS[i % len(KEYS)], f"prompt number {i} for key {i % len(KEYS)}") for i in range(12)]
        for key in KEYS:
            for path in ("/werk/v1/info", "/werk/v1/capabilities", "/metrics", "/werk/v1/states"):
                try:
                    status, _, _ = answer(env.send("GET", path, key))
                except TimeoutError:
                    pytest.fail(f"{path} starved while prefills waited for the state slot")
                assert status == 200, (path, status)
        lock.release()
        locked = False
        answers = [answer(conn) for conn in calls]
    finally:
        if locked:
            lock.release()
    statuses = sorted(status for status, _, _ in answers)
    assert statuses == [200] * HOST_BOUND + [503] * (12 - HOST_BOUND), [body for _, _, body in answers]
    for status, headers, body in answers:
        if status == 503:
            assert int(headers["retry-after"]) >= 1
            assert (body["error"]["code"], body["error"]["retryable"]) == ("unavailable", True)

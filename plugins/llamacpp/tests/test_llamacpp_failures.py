"""A real llama-server child that is killed or stopped under a real Werk host
(docs/operations.md, "Backend failures").

The host runs with short backend bounds (2 s), so a stopped child costs seconds. Streams are read
from a raw socket: the end of the chunked body (its last ``0`` chunk) is part of what is checked.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from werk_llamacpp.adapter import LlamaCppAdapter
from werk_llamacpp.testing.testmodel import generate_model

from werk_host.plugin import BackendBounds, HostConfig, ModelManifest
from werk_host.testing.api import Api
from werk_host.testing.host import Host, ModelRegistry, build_host
from werk_host.testing.hosts import running
from werk_host.testing.processes import gone

pytestmark = pytest.mark.llamaserver
KEY = "sk-werk-failures-test-123456"
MODEL = "slow"
CONTEXT = 8192
BOUNDS = BackendBounds(call_s=2.0, first_byte_s=2.0, idle_s=2.0)
#: The longest a client here waits for any answer: a hang fails the test instead of stalling it.
CLIENT_TIMEOUT_S = 30.0
QUESTION = [{"role": "user", "content": "Tell me a long story."}]


@dataclass
class Env:
    host: Host
    base: str
    api: Api

    @property
    def adapter(self) -> LlamaCppAdapter:
        adapter = self.host.fleet.adapter
        assert isinstance(adapter, LlamaCppAdapter)
        return adapter

    def child_pid(self) -> int:
        proc = self.adapter.current()
        assert proc is not None and proc.pid is not None
        return proc.pid


@pytest.fixture(scope="module")
def slow_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wider, deeper random model: milliseconds per token, so a long generation lasts seconds."""
    return generate_model(tmp_path_factory.mktemp("slow") / "slow.gguf", dim=512, layers=4, ctx=CONTEXT)


@pytest.fixture
def env(tmp_path: Path, llama_server_path: Path, slow_model: Path) -> Iterator[Env]:
    home = tmp_path / "home"
    home.mkdir()
    ModelRegistry(home).add(
        ModelManifest.from_paths(MODEL, [slow_model], backend="llama.cpp", params={"max_output_tokens": CONTEXT - 1})
    )
    config = HostConfig(
        home=home,
        api_keys=(KEY,),
        model=MODEL,
        backend_options={"llamacpp": {"llama_server": str(llama_server_path), "parallel": 2, "ctx": 2 * CONTEXT}},
        backend_bounds=BOUNDS,
    )
    host = build_host(config)
    with running(host) as base:
        env = Env(host, base, Api(base, KEY, timeout=CLIENT_TIMEOUT_S))
        pid = env.child_pid()
        try:
            yield env
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)  # never leave a stopped child behind


def post_raw(env: Env, path: str, body: dict[str, Any], *, when: bytes = b"", then: Any = None) -> bytes:
    """The raw answer to a POST, read to the end of the connection (``Connection: close``);
    ``then()`` runs once ``when`` has arrived."""
    payload = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {env.api.host}\r\nAuthorization: Bearer {KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
    ).encode()
    raw = b""
    with socket.create_connection((env.api.host, env.api.port), timeout=CLIENT_TIMEOUT_S) as sock:
        sock.sendall(head + payload)
        while chunk := sock.recv(65536):
            raw += chunk
            if then is not None and when and when in raw:
                then()
                then = None
    return raw


def dechunk(raw: bytes) -> tuple[int, bytes, bool]:
    """(status, body, whether the chunked body ended with its last chunk ``0\\r\\n\\r\\n``)."""
    head, _, rest = raw.partition(b"\r\n\r\n")
    assert b"transfer-encoding: chunked" in head.lower(), head
    body = b""
    while True:
        size_line, sep, rest = rest.partition(b"\r\n")
        if not sep:
            return int(head.split()[1]), body, False
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            return int(head.split()[1]), body, rest == b"\r\n"
        if len(rest) < size + 2:
            return int(head.split()[1]), body + rest[:size], False
        body, rest = body + rest[:size], rest[size + 2 :]


def test_sigkill_mid_stream_ends_the_v1_stream_with_an_error_event_and_the_last_chunk(env: Env) -> None:
    pid = env.child_pid()

    def kill() -> None:
        os.kill(pid, signal.SIGKILL)
        assert gone(pid, timeout=10)

    body = {"model": MODEL, "messages": QUESTION, "max_tokens": 6000, "stream": True, "ignore_eos": True}
    raw = post_raw(env, "/v1/chat/completions", body, when=b'"content":"', then=kill)
    status, stream, ended = dechunk(raw)
    assert status == 200
    assert ended, raw[-300:]  # the chunked body's proper end, not a cut connection
    events = [e.removeprefix(b"data: ") for e in stream.split(b"\n\n") if e.strip()]
    assert events[-1] == b"[DONE]"
    error = json.loads(events[-2])["error"]
    assert error == {
        "message": "llama-server stopped answering before the end",
        "type": "server_error",
        "param": None,
        "code": "unavailable",
    }
    assert not any(b'"finish_reason":"' in e for e in events)  # the answer was cut, and says so


def test_a_stopped_child_leaves_the_inventory_answering_and_v1_failing_within_the_bound(env: Env) -> None:
    status, before = env.api.get("/werk/v1/deployments")
    assert status == 200
    pid = env.child_pid()
    deployments = env.host.fleet.deployments
    assert deployments is not None
    deployments.watch.fresh_s = 0.0  # every listing asks the child again
    listing = Api(env.base, KEY, timeout=4.0)  # below the 5 s an unbounded slot read took
    os.kill(pid, signal.SIGSTOP)
    try:
        for _ in range(2):
            status, doc = listing.get("/werk/v1/deployments")
            assert status == 200 and isinstance(doc, dict)
            (row,) = doc["data"]["inventory"]
            assert row["state"] == "ready" and row["pid"] == pid  # the last known observation
        status, answer = env.api.post("/v1/chat/completions", {"model": MODEL, "messages": QUESTION, "max_tokens": 4})
        assert status == 503 and isinstance(answer, dict)
        assert answer["error"]["type"] == "server_error" and answer["error"]["code"] == "unavailable"
        assert str(pid) not in json.dumps(answer)
    finally:
        os.kill(pid, signal.SIGCONT)
    for _ in range(10):  # running again, the child works off what queued up meanwhile, then answers
        status, answer = env.api.post("/v1/chat/completions", {"model": MODEL, "messages": QUESTION, "max_tokens": 1})
        if status == 200:
            break
    assert status == 200, answer

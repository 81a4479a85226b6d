"""A backend that dies, stalls or hangs while Werk relays to it (docs/operations.md, "Backend failures").

The backend is a real child process: a small HTTP/1.1 server speaking OpenAI's chat route,
streaming events until it is killed, fronted by the host's relay
(:mod:`werk_host.backends.relay`) from a plugin built on the reference backend. Clients are raw
sockets, so the HTTP framing itself (the last chunk of a chunked body) is checked.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from werk_host import hookimpl
from werk_host.backends.relay import ConnectionPool, forward
from werk_host.config import BackendBounds
from werk_host.protocol import WorkerObservation
from werk_host.seam import InferenceResponse, JsonObject
from werk_host.testing.api import Api
from werk_host.testing.hosts import LiveHost, serving
from werk_host.testing.processes import gone
from werk_host.testing.reference import MemoryAdapter, MemoryBackendPlugin

#: A backend that streams chat events (one every 20 ms) until it is killed.
BACKEND = r"""
import http.server, json, sys, time

class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        self.send_response(200)
        if not body.get("stream"):  # a document announced whole, of which only the start comes
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "4096")
            self.end_headers()
            self.wfile.write(b'{"id": "c", "object": "chat.completion", ')
            self.wfile.flush()
            time.sleep(3600)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        n = 0
        while True:
            event = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
                     "choices": [{"index": 0, "delta": {"content": "w%d " % n}, "finish_reason": None}]}
            data = b"data: " + json.dumps(event).encode() + b"\n\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()
            n += 1
            time.sleep(0.02)

server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
"""

#: The bounds the host relays under here: short, so a hung backend costs the test seconds.
BOUNDS = BackendBounds(call_s=2.0, first_byte_s=2.0, idle_s=2.0)
#: The longest any client here waits for an answer (a hang fails the test instead of stalling it).
CLIENT_TIMEOUT_S = 30.0
CHAT: dict[str, Any] = {
    "model": "tiny",
    "messages": [{"role": "user", "content": "hello"}],
    "stream": True,
    "max_tokens": 16,
}


class RelayAdapter(MemoryAdapter):
    """The reference adapter, but chat completions go through the host relay to its plugin's
    ``pool``, and workers observations wait for its plugin's ``workers_release``."""

    plugin: RelayPlugin

    @hookimpl(specname="werk_chat_completion")
    def chat_completion(self, request: JsonObject) -> InferenceResponse:
        return forward(self.plugin.pool, "/v1/chat/completions", {k: v for k, v in request.items() if k != "werk"})

    @hookimpl(specname="werk_workers")
    def workers(self) -> list[WorkerObservation]:
        self.plugin.workers_release.wait(120.0)  # a backend that does not answer
        return [
            WorkerObservation(
                model=self.model_name,
                backend="reference",
                pid=os.getpid(),
                state="ready",
                slots=1,
                context_per_request_tokens=None,
                context_capacity_tokens=None,
            )
        ]


class RelayPlugin(MemoryBackendPlugin):
    """The reference backend, relaying to ``port`` (:class:`RelayAdapter`)."""

    adapter_class = RelayAdapter

    def __init__(self, port: int) -> None:
        super().__init__()
        self.pool = ConnectionPool("127.0.0.1", port, label="test-backend", bounds=BOUNDS)
        self.workers_release = threading.Event()
        self.workers_release.set()


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    script = tmp_path / "backend.py"
    script.write_text(BACKEND)
    child = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE)
    try:
        yield child
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGCONT)
            child.kill()
        child.wait(timeout=10)
        assert child.stdout is not None
        child.stdout.close()


@pytest.fixture
def live(tmp_path: Path, backend: subprocess.Popen[bytes]) -> Iterator[tuple[LiveHost, RelayPlugin]]:
    assert backend.stdout is not None
    port = int(backend.stdout.readline())
    plugin = RelayPlugin(port)
    with serving(tmp_path / "home", plugin=plugin, backend_bounds=BOUNDS) as host:
        yield host, plugin
    plugin.pool.close()


def post_raw(
    url: str, path: str, body: dict[str, Any], *, after_first: bytes = b"", then: Callable[[], None] | None = None
) -> bytes:
    """The raw HTTP answer to a POST (``Connection: close``: read to the end of the connection).
    Once ``after_first`` appears in what arrived, ``then()`` runs (it kills the backend)."""
    parts = urlsplit(url)
    payload = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
    ).encode()
    raw = b""
    with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 80), timeout=CLIENT_TIMEOUT_S) as s:
        s.sendall(head + payload)
        pending = then
        while chunk := s.recv(65536):
            raw += chunk
            if pending is not None and after_first and after_first in raw:
                pending()
                pending = None
    return raw


def dechunk(raw: bytes) -> tuple[int, dict[str, str], bytes, bool]:
    """(status, headers, body, whether the chunked body ended with its last chunk)."""
    head, _, rest = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    assert headers.get("transfer-encoding") == "chunked", headers
    body = b""
    while rest:
        size_line, sep, rest = rest.partition(b"\r\n")
        if not sep:
            return status, headers, body, False
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            return status, headers, body, rest == b"\r\n"
        if len(rest) < size + 2:
            return status, headers, body + rest[:size], False
        body, rest = body + rest[:size], rest[size + 2 :]
    return status, headers, body, False


def kill(child: subprocess.Popen[bytes]) -> None:
    os.kill(child.pid, signal.SIGKILL)
    assert gone(child.pid, timeout=10)


def no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    tracebacks = [r for r in caplog.records if r.exc_info]
    assert not tracebacks, [f"{r.name}: {r.getMessage()}" for r in tracebacks]


def test_a_v1_stream_whose_backend_is_killed_ends_with_an_error_event_and_the_last_chunk(
    live: tuple[LiveHost, RelayPlugin], backend: subprocess.Popen[bytes], caplog: pytest.LogCaptureFixture
) -> None:
    host, _ = live
    caplog.set_level(logging.INFO)
    raw = post_raw(host.url, "/v1/chat/completions", CHAT, after_first=b"w1 ", then=lambda: kill(backend))
    status, headers, body, ended = dechunk(raw)
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    assert ended, raw[-200:]  # a proper end of the chunked body, not a cut connection
    events = [e.removeprefix(b"data: ") for e in body.split(b"\n\n") if e]
    assert b'"w0 "' in events[0]
    assert events[-1] == b"[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["type"] == "server_error" and error["code"] == "unavailable"
    assert "test-backend" in error["message"] and "Error" not in error["message"]
    no_traceback(caplog)
    assert any("an answer broke off" in r.getMessage() for r in caplog.records)


def test_a_v1_stream_whose_backend_stalls_ends_with_an_error_event_after_the_idle_bound(
    live: tuple[LiveHost, RelayPlugin], backend: subprocess.Popen[bytes], caplog: pytest.LogCaptureFixture
) -> None:
    host, _ = live
    stop = lambda: os.kill(backend.pid, signal.SIGSTOP)  # noqa: E731
    raw = post_raw(host.url, "/v1/chat/completions", CHAT, after_first=b"w1 ", then=stop)
    _, _, body, ended = dechunk(raw)
    assert ended
    events = [e.removeprefix(b"data: ") for e in body.split(b"\n\n") if e]
    assert events[-1] == b"[DONE]" and json.loads(events[-2])["error"]["type"] == "server_error"
    no_traceback(caplog)


def test_anthropic_and_ollama_streams_end_in_their_own_error_shape_without_a_traceback(
    live: tuple[LiveHost, RelayPlugin], backend: subprocess.Popen[bytes], caplog: pytest.LogCaptureFixture
) -> None:
    host, _ = live
    messages = {"model": "tiny", "max_tokens": 16, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    raw = post_raw(host.url, "/v1/messages", messages, after_first=b"w1 ", then=lambda: kill(backend))
    _, _, body, ended = dechunk(raw)
    assert ended
    last = body.strip().split(b"\n\n")[-1]
    assert last.startswith(b"event: error\n")
    assert json.loads(last.split(b"data: ", 1)[1])["error"]["type"] in ("api_error", "overloaded_error")
    no_traceback(caplog)


def test_ollama_stream_ends_with_an_error_line_without_a_traceback(
    live: tuple[LiveHost, RelayPlugin], backend: subprocess.Popen[bytes], caplog: pytest.LogCaptureFixture
) -> None:
    host, _ = live
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "options": {"num_predict": 16}}
    raw = post_raw(host.url, "/api/chat", chat, after_first=b"w1 ", then=lambda: kill(backend))
    _, _, body, ended = dechunk(raw)
    assert ended
    assert "error" in json.loads(body.strip().split(b"\n")[-1])
    no_traceback(caplog)


def test_a_v1_document_whose_backend_is_killed_is_a_503_and_counts_as_failed(
    live: tuple[LiveHost, RelayPlugin], backend: subprocess.Popen[bytes], caplog: pytest.LogCaptureFixture
) -> None:
    """The backend began its document, then died: the client is told so (a typed, retryable
    503), never a short 200 (docs/operations.md, "Backend failures")."""
    host, _ = live
    document = {**CHAT, "stream": False}
    killer = threading.Timer(0.5, kill, (backend,))  # the document has begun; under the 2 s idle bound
    killer.start()
    raw = post_raw(host.url, "/v1/chat/completions", document)
    killer.join()
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.split()[1] == b"503", raw
    error = json.loads(body)["error"]
    assert (error["type"], error["code"]) == ("server_error", "unavailable") and "stopped" in error["message"]
    no_traceback(caplog)
    for _ in range(100):  # the answer is counted once the server has closed it
        status, doc = host.api.get("/werk/v1/observability")
        assert status == 200 and isinstance(doc, dict)
        if doc["data"]["chat"]["requests_active"] == 0:
            break
    assert doc["data"]["chat"]["requests_failed"] == 1


def test_a_hung_backend_answers_v1_with_a_retryable_503_within_the_first_byte_bound(
    live: tuple[LiveHost, RelayPlugin], backend: subprocess.Popen[bytes]
) -> None:
    host, _ = live
    os.kill(backend.pid, signal.SIGSTOP)
    try:
        raw = post_raw(host.url, "/v1/chat/completions", {**CHAT, "stream": False})
    finally:
        os.kill(backend.pid, signal.SIGCONT)
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.split()[1] == b"503"
    error = json.loads(body)["error"]
    assert error["type"] == "server_error" and "within 2 s" in error["message"]


def first_pid(api: Api) -> object:
    """The first instance's ``pid`` in ``GET /werk/v1/deployments`` (which must answer 200)."""
    status, doc = api.get("/werk/v1/deployments")
    assert status == 200 and isinstance(doc, dict)
    return doc["data"]["inventory"][0]["pid"]


def test_the_inventory_answers_while_a_workers_observation_hangs(live: tuple[LiveHost, RelayPlugin]) -> None:
    host, plugin = live
    deployments = host.host.fleet.deployments
    assert deployments is not None
    deployments.watch.fresh_s = 0.0  # every listing asks the backend again
    api = Api(host.url, timeout=10.0)  # far below the hung hook's wait
    plugin.workers_release.clear()
    try:
        assert first_pid(api) is None  # nothing observed yet: unknown, not guessed
    finally:
        plugin.workers_release.set()
    for _ in range(100):  # the hung call finishes once released; a later listing sees it
        if first_pid(api) is not None:
            break
    assert first_pid(api) == os.getpid()
    plugin.workers_release.clear()
    try:
        for _ in range(3):  # each answers from the last observation while the new call hangs
            assert first_pid(api) == os.getpid()
    finally:
        plugin.workers_release.set()

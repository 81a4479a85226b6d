"""Slow clients against a real waitress server (werk_host/serving.py; docs/operations.md,
"Connections"): requests trickled one byte at a time are closed at the request read deadline,
trickling sockets past the connection limit do not block new requests, a request in service is
never cut, and requests the parser refuses are answered in their API's error shape.

Every wait is bounded: a server without these guards fails each test within its timeouts.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import KEY
from werk_host.config import ServerLimits
from werk_host.server import make_server
from werk_host.testing.api import Api
from werk_host.testing.hosts import backend_host, running

#: Seconds between two bytes of a trickled body.
TICK = 0.5
#: A trickled request: headers at once, then 5,000 announced body bytes one per tick.
HEAD = "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 5000\r\n\r\n"


class Trickle:
    """``count`` sockets sending :data:`HEAD` for ``paths`` (in turn), then one body byte each
    per :data:`TICK` from a background thread; what each receives is kept. With ``reconnect``,
    a socket the server closes is replaced by a new one (an attacker keeping the pressure on).
    Without ``paths`` the sockets send nothing at all (idle connections)."""

    def __init__(self, port: int, count: int, paths: tuple[str, ...], *, reconnect: bool = False) -> None:
        self.port = port
        self.paths = paths
        self.reconnect = reconnect
        self.open: dict[int, socket.socket] = {}
        self.received: dict[int, bytes] = {}
        self.closed: set[int] = set()
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        for index in range(count):
            self._connect(index)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _connect(self, index: int) -> None:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        if self.paths:
            sock.sendall(HEAD.format(path=self.paths[index % len(self.paths)]).encode())
        sock.setblocking(False)
        self.open[index] = sock
        self.received[index] = b""

    def _run(self) -> None:
        serial = len(self.open)
        while not self.stopping.wait(TICK):
            with self.lock:
                for index, sock in list(self.open.items()):
                    if self._gone(index, sock):
                        del self.open[index]
                        sock.close()
                        self.closed.add(index)
                        if self.reconnect and not self.stopping.is_set():
                            with contextlib.suppress(OSError):
                                self._connect(serial)
                                serial += 1

    def _gone(self, index: int, sock: socket.socket) -> bool:
        try:
            while True:
                data = sock.recv(65536)
                if not data:
                    return True
                self.received[index] += data
        except BlockingIOError:
            pass
        except OSError:
            return True
        try:
            if self.paths:
                sock.send(b" ")
        except BlockingIOError:
            pass
        except OSError:
            return True
        return False

    def wait_closed(self, count: int, timeout: float) -> int:
        """Wait (at most ``timeout`` seconds) until ``count`` sockets were closed by the server."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.closed) >= count:
                    break
            time.sleep(TICK)
        with self.lock:
            return len(self.closed)

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=10)
        for sock in self.open.values():
            sock.close()


@contextlib.contextmanager
def trickling(port: int, count: int, paths: tuple[str, ...], *, reconnect: bool = False) -> Iterator[Trickle]:
    trickle = Trickle(port, count, paths, reconnect=reconnect)
    try:
        yield trickle
    finally:
        trickle.stop()


@contextlib.contextmanager
def served(home: Path, limits: ServerLimits) -> Iterator[Api]:
    host, _ = backend_host(home, api_keys=(KEY,), limits=limits)
    with running(host) as base:
        yield Api(base, KEY, timeout=10)


def _answer(raw: bytes) -> tuple[int, dict[str, Any]]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(body)


SHAPES = {
    "/v1/messages": lambda doc: doc["type"] == "error" and doc["error"]["type"] == "invalid_request_error",
    "/v1/chat/completions": lambda doc: doc["error"]["type"] == "invalid_request_error" and "param" in doc["error"],
    "/api/chat": lambda doc: isinstance(doc["error"], str),
    "/werk/v1/prefill": lambda doc: doc["error"]["code"] == "invalid_request" and "protocol" in doc,
}


def test_trickled_requests_are_closed_at_the_read_deadline(home: Path) -> None:
    # channel_timeout alone never fires: every socket sends a byte each TICK.
    limits = ServerLimits(threads=4, channel_timeout=60, cleanup_interval=1, request_read_timeout=3)
    paths = tuple(SHAPES)
    with served(home, limits) as api, trickling(api.port, 200, paths) as trickle:
        assert api.get("/werk/v1/info")[0] == 200
        # closed at request_read_timeout + cleanup_interval; 20 s bounds the test
        assert trickle.wait_closed(200, timeout=20) == 200
        answered: dict[str, int] = {}
        for index, raw in trickle.received.items():
            status, doc = _answer(raw)
            path = paths[index % len(paths)]
            assert status == 408 and SHAPES[path](doc), (path, raw)
            answered[path] = answered.get(path, 0) + 1
        assert set(answered) == set(paths)
        assert api.get("/werk/v1/info")[0] == 200


@pytest.mark.parametrize(("tricklers", "connection_limit"), [(1010, ServerLimits().connection_limit), (220, 200)])
def test_tricklers_past_the_connection_limit_do_not_block_new_requests(
    home: Path, tricklers: int, connection_limit: int
) -> None:
    # A read deadline far past the test: only the headroom at the limit can let requests in.
    limits = ServerLimits(
        threads=4, connection_limit=connection_limit, channel_timeout=60, cleanup_interval=1, request_read_timeout=600
    )
    with (
        served(home, limits) as api,
        trickling(api.port, tricklers, ("/v1/chat/completions",), reconnect=True) as trickle,
    ):
        for _ in range(5):  # each within the client's 10 s timeout, while the trickle goes on
            assert api.get("/werk/v1/info")[0] == 200
        assert trickle.wait_closed(1, timeout=5) >= 1  # the limit was reached: tricklers were shed
        assert len(trickle.open) > 0


def _slow_app(environ: dict[str, Any], start_response: Any) -> Iterator[bytes]:
    """``/stream``: an event stream of 8 events, 4 TICKs after the first, then one per TICK;
    else one answer after 8 TICKs. Both outlast the read deadline of the tests below and
    several sweeps."""
    if environ["PATH_INFO"] == "/stream":
        start_response("200 OK", [("Content-Type", "text/event-stream")])
        for index in range(8):  # a pause after the first event, while the tests load the server
            yield f"data: {index}\n\n".encode()
            time.sleep(4 * TICK if index == 0 else TICK)
        return
    time.sleep(8 * TICK)
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "4")])
    yield b"done"


def _receive_until(sock: socket.socket, marker: bytes) -> bytes:
    """Read until ``marker`` arrives, trickling one byte per read (a next request begins)."""
    received = b""
    while marker not in received:
        chunk = sock.recv(65536)
        assert chunk, received
        received += chunk
        with contextlib.suppress(OSError):
            sock.send(b" ")
    return received


@contextlib.contextmanager
def _serving_slow_app(limits: ServerLimits) -> Iterator[int]:
    server = make_server(_slow_app, "127.0.0.1", 0, limits)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        yield int(server.getsockname()[1])
    finally:
        server.task_dispatcher.shutdown(cancel_pending=True, timeout=5)
        server.close()
        thread.join(timeout=5)


def test_a_request_in_service_is_not_cut_by_the_read_deadline() -> None:
    limits = ServerLimits(threads=2, channel_timeout=60, cleanup_interval=1, request_read_timeout=1)
    with _serving_slow_app(limits) as port:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            # a stream, while the client trickles the start of a next request behind it
            sock.sendall(b"GET /stream HTTP/1.1\r\nHost: localhost\r\n\r\n")
            received = _receive_until(sock, b"data: 7\n\n")
            assert all(f"data: {i}\n\n".encode() in received for i in range(8))
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            # a slow answer, then a request pipelined behind it whose body trickles: its own
            # deadline runs once the answer is done
            sock.sendall(b"GET /slow HTTP/1.1\r\nHost: localhost\r\n\r\n")
            sock.sendall(b"POST /next HTTP/1.1\r\nHost: localhost\r\nContent-Length: 5000\r\n\r\n")
            received = _receive_until(sock, b"done")
            assert received.startswith(b"HTTP/1.1 200 OK")
            with contextlib.suppress(ConnectionResetError):
                while chunk := sock.recv(65536):
                    received += chunk
            assert b"HTTP/1.1 408 Request Timeout" in received


def test_a_request_in_service_is_never_shed_at_the_connection_limit() -> None:
    limits = ServerLimits(
        threads=2, connection_limit=30, channel_timeout=60, cleanup_interval=1, request_read_timeout=600
    )
    with _serving_slow_app(limits) as port, socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"GET /stream HTTP/1.1\r\nHost: localhost\r\n\r\n")
        received = sock.recv(65536)
        assert received.startswith(b"HTTP/1.1 200 OK"), received
        # While the stream pauses, it is the connection longest silent; idle sockets fill the
        # limit over and over, and the longest silent are shed first, but never one in service.
        with trickling(port, 60, (), reconnect=True) as trickle:
            while b"data: 7\n\n" not in received:
                chunk = sock.recv(65536)
                assert chunk, received
                received += chunk
            assert trickle.wait_closed(1, timeout=5) >= 1
        assert all(f"data: {i}\n\n".encode() in received for i in range(8))


def _raw(port: int, request: bytes) -> tuple[int, str, dict[str, Any]]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    content_type = next(
        (line.split(":", 1)[1].strip() for line in lines if line.lower().startswith("content-type:")), ""
    )
    return int(lines[0].split(" ", 2)[1]), content_type, json.loads(body)


@pytest.mark.parametrize("path", sorted(SHAPES))
def test_a_control_byte_in_a_header_is_400_in_the_api_shape(home: Path, path: str) -> None:
    with served(home, ServerLimits(threads=4)) as api:
        request = (
            f"POST {path} HTTP/1.1\r\nHost: localhost\r\nx-api-key: {KEY}\r\n"
            "anthropic-version: 2023-06-01\x01\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
        ).encode()
        status, content_type, doc = _raw(api.port, request)
        assert status == 400 and content_type.startswith("application/json"), doc
        assert SHAPES[path](doc), doc
        assert KEY not in json.dumps(doc)


def test_request_read_timeout_is_a_serve_option() -> None:
    from werk_host.cli.commands import build_parser

    args = build_parser().parse_args(["serve", "--request-read-timeout", "7"])
    assert args.request_read_timeout == 7
    assert build_parser().parse_args(["serve"]).request_read_timeout == ServerLimits().request_read_timeout
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--request-read-timeout", "0"])

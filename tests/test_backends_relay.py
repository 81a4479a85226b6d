"""werk_host.backends.relay: pooled keep-alive requests and a streaming relay that cancels on disconnect.

The upstream is a real threaded HTTP/1.1 server in this process; nothing is mocked.
"""

from __future__ import annotations

import http.client
import http.server
import json
import select
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

from werk_host.backends.managed import free_port
from werk_host.backends.relay import ClientGone, ConnectionPool, client_refusal, forward, post_json
from werk_host.errors import ErrorCode, WerkError
from werk_host.seam import client_disconnected

KEY = "sk-relay-upstream-0123456789"


@dataclass
class Upstream:
    """What the test server saw, and levers the tests pull."""

    port: int = 0
    requests: list[tuple[str, tuple[str, int], str | None]] = field(default_factory=list)
    """(path, client address, Authorization header) per request."""
    next_chunk: threading.Event = field(default_factory=threading.Event)
    client_left: threading.Event = field(default_factory=threading.Event)

    def peers(self) -> list[tuple[str, int]]:
        return [peer for _, peer, _ in self.requests]


def _closed_by_peer(sock: socket.socket) -> bool:
    readable, _, _ = select.select([sock], [], [], 0.05)
    if not readable:
        return False
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def make_handler(up: Upstream) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive

        def log_message(self, *args: Any) -> None:
            pass

        def send_json(self, status: int, data: object, extra: dict[str, str] | None = None) -> None:
            raw = json.dumps(data).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            for k, v in (extra or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(raw)

        def chunk(self, data: bytes) -> None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

        def start_events(self, extra: dict[str, str] | None = None) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            for k, v in (extra or {}).items():
                self.send_header(k, v)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            up.requests.append((self.path, self.client_address, self.headers.get("Authorization")))
            if self.path == "/echo":
                self.send_json(200, {"got": body}, {"X-Private": "not relayed"})
            elif self.path.startswith("/status/"):
                self.send_json(int(self.path.rsplit("/", 1)[1]), {"error": "upstream detail"})
            elif self.path == "/not-json":
                self.send_response(200)
                self.send_header("Content-Length", "3")
                self.end_headers()
                self.wfile.write(b"[1]")
            elif self.path == "/stream":  # one event, then the next only once the test asks for it
                self.start_events({"Cache-Control": "no-cache"})
                self.chunk(b"data: one\n\n")
                if not up.next_chunk.wait(10):
                    return
                self.chunk(b"data: two\n\n")
                self.chunk(b"data: [DONE]\n\n")
                self.wfile.write(b"0\r\n\r\n")
            elif self.path == "/stream-close":  # a whole stream, announced as the connection's last
                self.start_events({"Connection": "close"})
                self.chunk(b"data: [DONE]\n\n")
                self.wfile.write(b"0\r\n\r\n")
                self.close_connection = True
            elif self.path == "/endless":  # events until the relay hangs up
                self.start_events()
                deadline = time.monotonic() + 10
                try:
                    while time.monotonic() < deadline:
                        self.chunk(b"data: tick\n\n")
                        time.sleep(0.02)
                except OSError:
                    up.client_left.set()
                self.close_connection = True
            elif self.path == "/hold":  # no answer until the relay hangs up
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:
                    if _closed_by_peer(self.connection):
                        up.client_left.set()
                        break
                self.close_connection = True

    return Handler


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    up = Upstream()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), make_handler(up))
    server.daemon_threads = True
    up.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield up
    finally:
        up.next_chunk.set()
        server.shutdown()
        server.server_close()


@pytest.fixture
def pool(upstream: Upstream) -> Iterator[ConnectionPool]:
    pool = ConnectionPool("127.0.0.1", upstream.port, timeout=30, api_key=KEY, label="fake-server")
    yield pool
    pool.close()


def read_all(body: Iterator[bytes]) -> bytes:
    return b"".join(body)


# -- post_json and pooling ----------------------------------------------------------------------


def test_post_json_authenticates_and_reuses_one_connection(upstream: Upstream, pool: ConnectionPool) -> None:
    assert post_json(pool, "/echo", {"n": 1}) == {"got": {"n": 1}}
    assert pool.idle() == 1
    assert post_json(pool, "/echo", {"n": 2}) == {"got": {"n": 2}}
    assert [a for _, _, a in upstream.requests] == [f"Bearer {KEY}"] * 2
    first, second = upstream.peers()
    assert first == second  # the same keep-alive connection
    assert KEY not in repr(pool)


def test_a_connection_idle_too_long_is_not_reused(upstream: Upstream) -> None:
    pool = ConnectionPool("127.0.0.1", upstream.port, idle_reuse_s=0.0)
    try:
        post_json(pool, "/echo", {})
        post_json(pool, "/echo", {})
        first, second = upstream.peers()
        assert first != second
        assert upstream.requests[0][2] is None  # no key, no Authorization header
    finally:
        pool.close()


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (400, ErrorCode.INVALID_REQUEST),
        (422, ErrorCode.INVALID_REQUEST),
        (401, ErrorCode.UNAVAILABLE),
        (429, ErrorCode.UNAVAILABLE),
        (500, ErrorCode.UNAVAILABLE),
        (503, ErrorCode.UNAVAILABLE),
    ],
)
def test_post_json_maps_statuses(pool: ConnectionPool, status: int, code: ErrorCode) -> None:
    with pytest.raises(WerkError) as err:
        post_json(pool, f"/status/{status}", {})
    assert err.value.code == code
    assert "upstream detail" not in err.value.message  # the backend's own text stays in the log
    if code == ErrorCode.UNAVAILABLE:
        assert err.value.retryable and err.value.message == f"fake-server /status/{status} failed ({status})"
    assert pool.idle() == 1  # an error answer still leaves a reusable connection


def test_post_json_status_mapping_is_a_parameter(pool: ConnectionPool) -> None:
    assert client_refusal(404) and not client_refusal(408) and not client_refusal(500)
    with pytest.raises(WerkError) as err:
        post_json(pool, "/status/404", {}, is_refusal=lambda status: False)
    assert err.value.code == ErrorCode.UNAVAILABLE
    with pytest.raises(WerkError) as err:
        post_json(pool, "/status/500", {}, is_refusal=lambda status: status == 500)
    assert err.value.code == ErrorCode.INVALID_REQUEST


def test_post_json_refuses_a_non_object_answer(pool: ConnectionPool) -> None:
    with pytest.raises(WerkError) as err:
        post_json(pool, "/not-json", {})
    assert err.value.code == ErrorCode.UNAVAILABLE and err.value.message == "fake-server /not-json failed (200)"


def test_a_dead_upstream_is_a_typed_retryable_error() -> None:
    pool = ConnectionPool("127.0.0.1", free_port(), label="fake-server")  # nothing listens there
    for call in (post_json, forward):
        with pytest.raises(WerkError) as err:
            call(pool, "/echo", {})
        assert err.value.code == ErrorCode.UNAVAILABLE and err.value.retryable
        assert err.value.message == "fake-server is not answering"
        assert isinstance(err.value.__cause__, ConnectionRefusedError)
    assert pool.idle() == 0


@contextmanager
def stale_connection(pool: ConnectionPool) -> Iterator[http.client.HTTPConnection]:
    """Put a kept-alive connection whose server has hung up on top of ``pool``."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        stale = http.client.HTTPConnection("127.0.0.1", listener.getsockname()[1], timeout=5)
        stale.connect()
        listener.accept()[0].close()
        pool.release(stale)
        yield stale
    assert stale.sock is None  # it was taken, failed, and dropped


def test_a_pooled_connection_closed_by_the_server_is_replaced(upstream: Upstream, pool: ConnectionPool) -> None:
    with stale_connection(pool):
        assert post_json(pool, "/echo", {"n": 1}) == {"got": {"n": 1}}
    with stale_connection(pool):
        response = forward(pool, "/echo", {"n": 2})
        assert json.loads(read_all(response.body)) == {"got": {"n": 2}}
        response.close()
    assert len(upstream.requests) == 2  # each request reached the upstream exactly once


def test_an_idle_connection_the_server_closed_is_not_handed_out(upstream: Upstream, pool: ConnectionPool) -> None:
    assert post_json(pool, "/echo", {"n": 1}) == {"got": {"n": 1}}
    live, reused = pool.acquire()
    assert reused and live.sock is not None  # open on both ends: reused
    pool.release(live)
    with stale_connection(pool) as stale:
        conn, reused = pool.acquire()
        assert conn is not stale and stale.sock is None  # the closed one was dropped, unsent
        assert conn is live and reused
        pool.release(conn)
    assert post_json(pool, "/echo", {"n": 2}) == {"got": {"n": 2}}
    assert len(upstream.requests) == 2 and upstream.peers()[0] == upstream.peers()[1]


# -- forward --------------------------------------------------------------------------------------


def test_forward_streams_each_chunk_as_it_arrives(upstream: Upstream, pool: ConnectionPool) -> None:
    response = forward(pool, "/stream", {"stream": True})
    assert response.status == 200
    assert response.headers == {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    first = next(response.body)
    assert first == b"data: one\n\n"  # relayed while the upstream still holds back the rest
    upstream.next_chunk.set()
    assert read_all(response.body) == b"data: two\n\ndata: [DONE]\n\n"
    response.close()
    assert pool.idle() == 1  # read to the end: the connection goes back to the pool
    assert upstream.requests[0][2] == f"Bearer {KEY}"


def test_forward_relays_a_whole_answer_and_reuses_the_connection(upstream: Upstream, pool: ConnectionPool) -> None:
    for n in range(3):
        response = forward(pool, "/echo", {"n": n})
        assert response.headers == {
            "Content-Type": "application/json",
            "Content-Length": str(len(b'{"got": {"n": 0}}')),
        }
        assert json.loads(read_all(response.body)) == {"got": {"n": n}}
        response.close()
        response.close()  # idempotent
    assert len(set(upstream.peers())) == 1


def test_forward_relays_error_statuses_as_they_are(pool: ConnectionPool) -> None:
    response = forward(pool, "/status/400", {})
    assert response.status == 400 and json.loads(read_all(response.body)) == {"error": "upstream detail"}
    response.close()


def test_closing_a_stream_early_closes_the_upstream(upstream: Upstream, pool: ConnectionPool) -> None:
    response = forward(pool, "/endless", {"stream": True})
    assert next(response.body).startswith(b"data: tick")
    response.close()
    assert upstream.client_left.wait(10)  # the upstream saw its client go
    assert pool.idle() == 0  # a half-read connection is never reused


def test_a_client_that_leaves_before_the_first_byte_cancels_the_upstream(
    upstream: Upstream, pool: ConnectionPool
) -> None:
    left = threading.Event()
    threading.Timer(0.3, left.set).start()
    token = client_disconnected.set(left.is_set)
    try:
        t0 = time.monotonic()
        with pytest.raises(ClientGone) as err:
            forward(pool, "/hold", {})
        assert time.monotonic() - t0 < 5
    finally:
        client_disconnected.reset(token)
    assert err.value.code == ErrorCode.UNAVAILABLE
    assert upstream.client_left.wait(10)  # the upstream request was closed, not left running
    assert pool.idle() == 0


# -- the spare connection -------------------------------------------------------------------------


def test_a_server_that_closes_after_a_stream_leaves_a_connected_spare(upstream: Upstream, pool: ConnectionPool) -> None:
    response = forward(pool, "/stream-close", {"stream": True})
    assert read_all(response.body) == b"data: [DONE]\n\n"
    response.close()
    assert pool.idle() == 1  # connected for the next request, before it came
    spare, reused = pool.acquire()
    assert reused and spare.sock is not None
    spare_port = spare.sock.getsockname()[1]
    pool.release(spare)
    assert post_json(pool, "/echo", {"n": 1}) == {"got": {"n": 1}}
    assert upstream.peers()[-1][1] == spare_port  # the next request went over the spare
    assert upstream.peers()[0] != upstream.peers()[-1]


def test_a_spare_is_made_only_when_none_is_idle(upstream: Upstream, pool: ConnectionPool) -> None:
    assert post_json(pool, "/echo", {}) == {"got": {}}
    idle, _ = pool.acquire()
    pool.release(idle)
    response = forward(pool, "/stream-close", {"stream": True})  # takes ``idle``; none left
    read_all(response.body)
    response.close()
    assert pool.idle() == 1
    response = forward(pool, "/stream-close", {"stream": True})  # takes the spare
    pool.release(http.client.HTTPConnection("127.0.0.1", upstream.port))  # another comes back meanwhile
    read_all(response.body)
    response.close()
    assert pool.idle() == 1  # no spare on top of an idle connection


def test_no_spare_after_an_early_close_a_dead_server_or_a_closed_pool(upstream: Upstream) -> None:
    dead = ConnectionPool("127.0.0.1", free_port())
    dead.prepare()  # nothing listens: nothing kept, nothing raised
    assert dead.idle() == 0
    pool = ConnectionPool("127.0.0.1", upstream.port)
    response = forward(pool, "/stream-close", {"stream": True})
    pool.close()  # the process behind the pool was replaced while the stream ran
    read_all(response.body)
    response.close()
    late = http.client.HTTPConnection("127.0.0.1", upstream.port)
    late.connect()
    pool.release(late)
    assert pool.idle() == 0 and late.sock is None  # a closed pool takes nothing back

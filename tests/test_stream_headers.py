"""``werk serve`` sends a stream's status and headers before its first byte (werk_host.server.stream_headers_first).

A real waitress server (``make_server``, as ``werk serve`` builds it) serves a WSGI app whose
stream is held back until the test releases it: the client must get the headers meanwhile.
"""

from __future__ import annotations

import http.client
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import pytest

from werk_host.config import ServerLimits
from werk_host.server import make_server, stream_headers_first

Start = Callable[..., Callable[[bytes], object]]


class Gated:
    """A response body that yields nothing until ``release`` is set, and records ``close``."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks
        self.release = threading.Event()
        self.closed = threading.Event()

    def __iter__(self) -> Iterator[bytes]:
        if not self.release.wait(10):
            return
        yield from self.chunks

    def close(self) -> None:
        self.closed.set()


def gated_app(content_type: str, body: Gated, length: int | None = None) -> Callable[..., Iterable[bytes]]:
    def app(environ: dict[str, object], start_response: Start) -> Iterable[bytes]:
        headers = [("Content-Type", content_type)]
        if length is not None:
            headers.append(("Content-Length", str(length)))
        start_response("200 OK", headers)
        return body

    return app


@contextmanager
def serving(app: Callable[..., Iterable[bytes]]) -> Iterator[int]:
    server = make_server(app, "127.0.0.1", 0, ServerLimits(threads=2))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        server.close()


@pytest.mark.parametrize(
    "content_type", ["text/event-stream", "text/event-stream; charset=utf-8", "application/x-ndjson"]
)
def test_a_stream_s_headers_arrive_before_its_first_byte(content_type: str) -> None:
    body = Gated([b"data: one\n\n", b"data: [DONE]\n\n"])
    with serving(gated_app(content_type, body)) as port:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/")
        response = conn.getresponse()  # would time out if the headers waited for the first event
        assert response.status == 200 and response.getheader("Content-Type") == content_type
        assert not body.closed.is_set()
        body.release.set()
        assert response.read() == b"data: one\n\ndata: [DONE]\n\n"
        conn.close()
    assert body.closed.wait(5)


@pytest.mark.parametrize(
    ("content_type", "length"), [("application/json", None), ("text/event-stream", len(b"data: one\n\n"))]
)
def test_other_responses_keep_their_headers_until_the_body(content_type: str, length: int | None) -> None:
    body = Gated([b"data: one\n\n"])
    with serving(gated_app(content_type, body, length)) as port:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=0.5)
        conn.request("GET", "/")
        with pytest.raises(TimeoutError):
            conn.getresponse()  # PEP 3333: no headers before the first non-empty chunk
        body.release.set()
        conn.close()


def test_a_failed_early_write_closes_the_body() -> None:
    body = Gated([b"data: one\n\n"])
    app = stream_headers_first(gated_app("text/event-stream", body))

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: object = None) -> Callable[[bytes], None]:
        def write(data: bytes) -> None:
            raise ConnectionResetError("the client left")

        return write

    with pytest.raises(ConnectionResetError):
        app({}, start_response)  # type: ignore[arg-type]
    assert body.closed.is_set()  # its upstream request would be closed with it

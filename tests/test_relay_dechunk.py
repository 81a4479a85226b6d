"""werk_host.backends.relay's chunked-body reader: one piece per socket read, the payload whole
at every split of the bytes, and every cut or broken frame a :class:`BackendCut`.

The reader sees a response whose buffered socket hands out prescribed reads; the streaming
relay over a real upstream is tests/test_backends_relay.py's.
"""

from __future__ import annotations

import http.client
from typing import cast

import pytest

from werk_host.backends.relay import MAX_CHUNK_LINE, READ_CHUNK, BackendCut, _dechunk

PAYLOAD = [b'data: {"a": 1}\n\n', b'data: {"b": 2}\n\n', b"x" * 300, b"data: [DONE]\n\n"]


def framed(pieces: list[bytes], *, extension: bool = True, trailers: bool = True) -> bytes:
    raw = b""
    for i, piece in enumerate(pieces):
        ext = b";name=value" if extension and i == 1 else b""
        raw += b"%x%s\r\n%s\r\n" % (len(piece), ext, piece)
    raw += b"0\r\n"
    if trailers:
        raw += b"X-Trailer: yes\r\n"
    return raw + b"\r\n"


class Reads:
    """A buffered socket that returns ``reads`` one per ``read1``, then EOF."""

    def __init__(self, reads: list[bytes]) -> None:
        self.reads = list(reads)

    def read1(self, size: int) -> bytes:
        assert size > 0
        return self.reads.pop(0) if self.reads else b""


class Response:
    chunked = True
    chunk_left: int | None = None
    length: int | None = None
    will_close = False

    def __init__(self, reads: list[bytes]) -> None:
        self.fp = Reads(reads)


def dechunk(reads: list[bytes]) -> tuple[list[bytes], Response]:
    response = Response(reads)
    out = list(_dechunk(cast(http.client.HTTPResponse, response), lambda: response.fp.read1(READ_CHUNK), "upstream"))
    return out, response


def test_each_read_is_one_piece_of_payload() -> None:
    raw = framed(PAYLOAD)
    out, response = dechunk([raw])
    assert out == [b"".join(PAYLOAD)]  # events that arrived together leave together
    assert response.length == 0 and response.chunk_left is None  # read to the end


@pytest.mark.parametrize("trailers", [True, False])
def test_the_payload_is_whole_at_every_split(trailers: bool) -> None:
    raw = framed(PAYLOAD, trailers=trailers)
    for i in range(1, len(raw)):
        out, _ = dechunk([raw[:i], raw[i:]])
        assert b"".join(out) == b"".join(PAYLOAD), i
        assert all(out), i  # nothing empty is yielded
    for i in range(1, len(raw), 7):
        for j in range(i + 1, len(raw), 11):
            out, _ = dechunk([raw[:i], raw[i:j], raw[j:]])
            assert b"".join(out) == b"".join(PAYLOAD), (i, j)


def test_a_byte_at_a_time() -> None:
    raw = framed(PAYLOAD)
    out, _ = dechunk([raw[i : i + 1] for i in range(len(raw))])
    assert b"".join(out) == b"".join(PAYLOAD)


def test_every_cut_short_body_is_a_backend_cut() -> None:
    raw = framed(PAYLOAD)
    for i in range(len(raw)):
        with pytest.raises(BackendCut):
            dechunk([raw[:i]] if i else [])


@pytest.mark.parametrize(
    "raw",
    [
        b"zz\r\nabc\r\n0\r\n\r\n",  # not a size
        b"3\r\nabcXY0\r\n\r\n",  # no CRLF after the data
        b"-3\r\nabc\r\n0\r\n\r\n",  # a negative size
        b"1" * (MAX_CHUNK_LINE + 10),  # a size line without end
    ],
)
def test_broken_framing_is_a_backend_cut(raw: bytes) -> None:
    with pytest.raises(BackendCut):
        dechunk([raw])


def test_bytes_after_the_end_keep_the_payload_and_retire_the_connection() -> None:
    out, response = dechunk([framed(PAYLOAD) + b"HTTP/1.1 200 OK\r\n"])
    assert b"".join(out) == b"".join(PAYLOAD)
    assert response.will_close  # never a pipelined answer: the connection is not reused
    _, clean = dechunk([framed(PAYLOAD)])
    assert not clean.will_close


def test_a_read_failure_is_a_backend_cut() -> None:
    class Failing(Reads):
        def read1(self, size: int) -> bytes:
            raise TimeoutError("timed out")

    response = Response([])
    response.fp = Failing([])
    with pytest.raises(BackendCut):
        list(_dechunk(cast(http.client.HTTPResponse, response), lambda: response.fp.read1(READ_CHUNK), "upstream"))


def test_a_pumped_read_with_nothing_yields_an_empty_piece_and_the_payload_stays_whole() -> None:
    raw = framed(PAYLOAD)
    reads: list[bytes | None] = [raw[:7], None, raw[7:30], None, None, raw[30:]]
    response = Response([])
    out = list(_dechunk(cast(http.client.HTTPResponse, response), lambda: reads.pop(0) if reads else b"", "upstream"))
    assert out.count(b"") == 3
    assert b"".join(out) == b"".join(PAYLOAD)
    assert response.length == 0

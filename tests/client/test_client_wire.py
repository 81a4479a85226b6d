"""The client against small misbehaving servers: every deviation is a typed error."""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any

import pytest

from tests.client.rawserver import INFO, chunked, envelope, error_envelope, http, raw_server
from werk_host.client import (
    API_ERRORS,
    ClientTimeoutError,
    FramingError,
    IncompatibleVersionError,
    ProtocolViolationError,
    RedirectError,
    RequestTooLargeError,
    ResponseTooLargeError,
    TransportError,
    VersionHeaderMismatchError,
    WerkApiError,
    WerkClientError,
    WerkProtocolClient,
)
from werk_host.errors import ErrorCode
from werk_host.protocol import ChatMessage, ChatRequest, DecodeRequest, RuntimeInfo

KEY = "sk-werk-wire-7f3a9c0d1e2b"
HANDOFF = "hoff-secret-4b1d9e77aa05c3"
LIMIT = 8 << 20


def client(url: str, **kw: object) -> WerkProtocolClient:
    return WerkProtocolClient(url, KEY, timeout=kw.pop("timeout", 5.0), **kw)  # type: ignore[arg-type]


def assert_clean(err: BaseException) -> None:
    for text in (str(err), repr(err), json.dumps(getattr(err, "as_dict", dict)())):
        assert KEY not in text
        assert HANDOFF not in text


# -- the happy path and what is sent ---------------------------------------------------------
def test_sends_negotiation_headers_and_accepts_a_valid_envelope() -> None:
    with raw_server(http(envelope(INFO))) as srv:
        info = client(srv.url).info()
    assert isinstance(info, RuntimeInfo)
    [req] = srv.requests
    assert (req.method, req.target) == ("GET", "/werk/v1/info")
    assert req.headers["accept"] == "application/json"
    assert req.headers["x-werk-protocol-version"] == "1.0"
    assert req.headers["authorization"] == f"Bearer {KEY}"
    assert req.headers["host"] == srv.url.removeprefix("http://")
    assert req.headers["connection"] == "close"


def test_missing_version_header_is_accepted() -> None:
    with raw_server(http(envelope(INFO), version_header=None)) as srv:
        assert client(srv.url).info().service == "werk-host"


def test_no_key_sends_no_authorization_and_deployment_is_sent() -> None:
    with raw_server(http(envelope(INFO))) as srv:
        WerkProtocolClient(srv.url, deployment="llamacpp:tiny").info()
    assert "authorization" not in srv.requests[0].headers
    assert srv.requests[0].headers["x-werk-deployment"] == "llamacpp:tiny"


def test_query_parameters_are_encoded() -> None:
    from werk_host.protocol import StateListQuery

    page: dict[str, Any] = {"states": [], "next_cursor": None}
    profile: dict[str, Any] = {
        "model": "m",
        "backend": None,
        "supported": False,
        "source": None,
        "default_tier": None,
        "default_adjusted_to_limits": False,
        "limits": None,
        "tiers": [],
    }
    with raw_server(http(envelope(page)), http(envelope(profile))) as srv:
        client(srv.url).list_states(StateListQuery(model_id="a b&c", tier="disk", limit=5, cursor="x/y"))
        client(srv.url).reasoning("m", 99)
    assert srv.requests[0].target == "/werk/v1/states?model_id=a%20b%26c&tier=disk&limit=5&cursor=x%2Fy"
    assert srv.requests[1].target == "/werk/v1/chat/reasoning?max_output_tokens=99&model=m"


def test_a_valid_chunked_response_with_extensions_and_trailers_is_accepted() -> None:
    body = envelope(INFO)
    framed = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in (body[:10], body[10:50], body[50:]))
    framed += b"0\r\nX-Trailer: yes\r\n\r\n"
    raw = http(framed, content_length=None, extra_headers=(("Transfer-Encoding", "chunked"),))
    with raw_server(raw) as srv:
        assert client(srv.url).info().service == "werk-host"


def test_interim_100_continue_is_skipped() -> None:
    raw = b"HTTP/1.1 100 Continue\r\n\r\n" + http(envelope(INFO))
    with raw_server(raw) as srv:
        assert client(srv.url).info().service == "werk-host"


def _inventory(error: str) -> dict[str, Any]:
    entry = {
        "id": "a",
        "backend": "b",
        "model": "m",
        "aliases": [],
        "default": True,
        "state": "failed",
        "pid": None,
        "endpoint": "local",
        "started_unix_ms": None,
        "last_used_unix_ms": None,
        "in_flight": 0,
        "keep_alive_seconds": None,
        "error": error,
    }
    return {"inventory": [entry], "plans": [], "slots": []}


def test_a_body_of_exactly_8_mib_is_accepted() -> None:
    pad = LIMIT - len(envelope(_inventory("")))
    body = envelope(_inventory("x" * pad))
    assert len(body) == LIMIT
    with raw_server(http(body)) as srv:
        assert len(client(srv.url).deployments().inventory[0].error or "") == pad


# -- redirects -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "status",
    ["301 Moved Permanently", "302 Found", "303 See Other", "307 Temporary Redirect", "308 Permanent Redirect"],
)
def test_redirects_are_never_followed(status: str) -> None:
    with raw_server(http(envelope(INFO))) as target:
        location = (("Location", f"{target.url}/werk/v1/info"),)
        with (
            raw_server(http(b"", status=status, extra_headers=location)) as srv,
            pytest.raises(RedirectError) as caught,
        ):
            client(srv.url).info()
        assert target.requests == []
    assert caught.value.status == int(status[:3])
    assert caught.value.code == "redirect"
    assert not caught.value.retryable


# -- size bounds -------------------------------------------------------------------------------
def test_oversized_content_length_is_rejected_before_reading() -> None:
    with raw_server(http(b"{}", content_length=LIMIT + 1)) as srv, pytest.raises(ResponseTooLargeError):
        client(srv.url).info()


def test_oversized_actual_body_is_rejected() -> None:
    body = envelope({"inventory": [{"pad": "x" * LIMIT}], "plans": [], "slots": []})
    with raw_server(http(body)) as srv, pytest.raises(ResponseTooLargeError):
        client(srv.url).deployments()


def test_oversized_chunked_body_is_rejected() -> None:
    def drip(sock: socket.socket, stop: threading.Event) -> None:
        sock.sendall(http(b"", content_length=None, extra_headers=(("Transfer-Encoding", "chunked"),)))
        block = b"x" * (1 << 20)
        for _ in range(9):
            sock.sendall(b"%x\r\n%s\r\n" % (len(block), block))
        sock.sendall(b"0\r\n\r\n")

    with raw_server(drip) as srv, pytest.raises(ResponseTooLargeError):
        client(srv.url).info()


def test_request_over_1_mib_is_refused_without_sending() -> None:
    big = ChatRequest(messages=[ChatMessage(role="user", content="x" * (1 << 20))])
    with raw_server(http(envelope(INFO))) as srv:
        with pytest.raises(RequestTooLargeError):
            client(srv.url).count_tokens(big)
        assert srv.connections == 0


# -- framing -----------------------------------------------------------------------------------
def test_lying_content_length_short_body() -> None:
    body = envelope(INFO)
    with raw_server(http(body, content_length=len(body) + 100)) as srv, pytest.raises(FramingError):
        client(srv.url).info()


def test_lying_content_length_extra_bytes_in_the_same_segment() -> None:
    body = envelope(INFO)
    with raw_server(http(body + b'{"x": 1}', content_length=len(body))) as srv, pytest.raises(FramingError):
        client(srv.url).info()


def test_lying_content_length_extra_bytes_sent_late() -> None:
    body = envelope(INFO)

    def late(sock: socket.socket, stop: threading.Event) -> None:
        sock.sendall(http(body))
        time.sleep(0.1)
        sock.sendall(b"surprise")

    with raw_server(late) as srv, pytest.raises(FramingError):
        client(srv.url).info()


def test_a_server_that_keeps_the_connection_open_after_a_complete_body_is_fine() -> None:
    with raw_server(http(envelope(INFO)), linger=3) as srv:
        started = time.monotonic()
        assert client(srv.url).info().service == "werk-host"
    assert time.monotonic() - started < 2.5


TE = (("Transfer-Encoding", "chunked"),)
BROKEN_CHUNKED = {
    "bad-hex": b"zz\r\n{}\r\n0\r\n\r\n",
    "signed-size": b"+2\r\n{}\r\n0\r\n\r\n",
    "size-too-long": b"00000000000000002\r\n{}\r\n0\r\n\r\n",
    "no-crlf-after-data": b"2\r\n{}XX0\r\n\r\n",
    "data-longer-than-size": b"1\r\n{}\r\n0\r\n\r\n",
    "eof-inside-chunk": b"10\r\n{}",
    "eof-before-last-chunk": b"2\r\n{}\r\n",
    "eof-before-trailer-end": b"2\r\n{}\r\n0\r\n",
    "bare-lf": b"2\n{}\n0\n\n",
    "bytes-after-last-chunk": chunked(envelope(INFO)) + b"garbage",
    "malformed-trailer": b"2\r\n{}\r\n0\r\nnot a header\r\n\r\n",
}


@pytest.mark.parametrize("name", sorted(BROKEN_CHUNKED))
def test_broken_chunked_framing_is_rejected(name: str) -> None:
    raw = http(BROKEN_CHUNKED[name], content_length=None, extra_headers=TE)
    with raw_server(raw) as srv, pytest.raises(FramingError):
        client(srv.url).info()


BAD_HEADS = {
    "te-and-cl": http(chunked(envelope(INFO)), content_length=10, extra_headers=TE),
    "te-gzip": http(envelope(INFO), content_length=None, extra_headers=(("Transfer-Encoding", "gzip"),)),
    "te-twice-chunked": http(
        chunked(envelope(INFO)), content_length=None, extra_headers=(("Transfer-Encoding", "chunked, chunked"),)
    ),
    "chunked-in-http-1.0": http(
        chunked(envelope(INFO)), content_length=None, extra_headers=TE, http_version="HTTP/1.0"
    ),
    "conflicting-cl": http(envelope(INFO), extra_headers=(("Content-Length", "3"),)),
    "non-numeric-cl": http(envelope(INFO), content_length=None, extra_headers=(("Content-Length", "12abc"),)),
    "negative-cl": http(envelope(INFO), content_length=None, extra_headers=(("Content-Length", "-1"),)),
    "no-framing": http(envelope(INFO), content_length=None),
    "not-http": b"SSH-2.0-OpenSSH\r\n\r\n",
    "http-2-status": b"HTTP/2 200 OK\r\nContent-Length: 0\r\n\r\n",
    "obs-fold": http(envelope(INFO), extra_headers=(("X-A", "b\r\n c"),)),
    "space-before-colon": http(envelope(INFO), extra_headers=(("X-A ", "b"),)),
    "nul-in-header": http(envelope(INFO), extra_headers=(("X-A", "b\x00c"),)),
    "huge-head": http(envelope(INFO), extra_headers=tuple((f"X-{i}", "v" * 1000) for i in range(80))),
    "eof-in-head": b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n",
}


@pytest.mark.parametrize("name", sorted(BAD_HEADS))
def test_bad_response_heads_are_framing_errors(name: str) -> None:
    with raw_server(BAD_HEADS[name]) as srv, pytest.raises(FramingError) as caught:
        client(srv.url).info()
    assert caught.value.code == "framing_error"
    assert isinstance(caught.value, ProtocolViolationError)


def test_switching_protocols_is_a_violation() -> None:
    raw = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n"
    with raw_server(raw) as srv, pytest.raises(ProtocolViolationError):
        client(srv.url).info()


# -- version negotiation -----------------------------------------------------------------------
@pytest.mark.parametrize("header", ["1.1", "2.0", "0.9", "1", "junk", "1.0, 1.0", ""])
def test_version_header_disagreeing_with_the_envelope(header: str) -> None:
    with raw_server(http(envelope(INFO), version_header=header)) as srv, pytest.raises(VersionHeaderMismatchError):
        client(srv.url).info()


def test_repeated_version_header_is_a_violation() -> None:
    raw = http(envelope(INFO), extra_headers=(("X-Werk-Protocol-Version", "1.0"),))
    with raw_server(raw) as srv, pytest.raises(ProtocolViolationError):
        client(srv.url).info()


@pytest.mark.parametrize(("major", "minor"), [(1, 1), (1, 7), (2, 0), (0, 9), (0, 0)])
@pytest.mark.parametrize("with_header", [True, False])
def test_incompatible_envelope_versions(major: int, minor: int, with_header: bool) -> None:
    header = f"{major}.{minor}" if with_header else None
    raw = http(envelope(INFO, major=major, minor=minor), version_header=header)
    with raw_server(raw) as srv, pytest.raises(IncompatibleVersionError) as caught:
        client(srv.url).info()
    assert caught.value.code == "incompatible_version"


def test_an_error_envelope_from_a_newer_minor_is_still_incompatible() -> None:
    raw = http(error_envelope("not_found", minor=1), status="404 Not Found", version_header="1.1")
    with raw_server(raw) as srv, pytest.raises(IncompatibleVersionError):
        client(srv.url).info()


# -- missing or malformed envelopes ------------------------------------------------------------
MISSING = {
    "bare-data": http(json.dumps(INFO).encode()),
    "html-502": http(b"<html>bad gateway</html>", status="502 Bad Gateway", content_type="text/html"),
    "json-array": http(b"[1, 2]"),
    "not-json": http(b"{not json"),
    "empty-body": http(b""),
    "no-content-type": http(envelope(INFO), content_type=None),
    "text-plain": http(envelope(INFO), content_type="text/plain"),
    "bad-utf8": http(b'{"protocol": "\xff"}'),
    "protocol-strings": http(
        json.dumps({"protocol": {"major": "1", "minor": "0"}, "request_id": "r", "data": INFO}).encode()
    ),
    "protocol-bools": http(
        json.dumps({"protocol": {"major": True, "minor": False}, "request_id": "r", "data": INFO}).encode()
    ),
    "protocol-extra": http(
        json.dumps({"protocol": {"major": 1, "minor": 0, "patch": 1}, "request_id": "r", "data": INFO}).encode()
    ),
    "no-request-id": http(json.dumps({"protocol": {"major": 1, "minor": 0}, "data": INFO}).encode()),
    "numeric-request-id": http(
        json.dumps({"protocol": {"major": 1, "minor": 0}, "request_id": 7, "data": INFO}).encode()
    ),
    "no-data": http(json.dumps({"protocol": {"major": 1, "minor": 0}, "request_id": "r"}).encode()),
    "data-and-error": http(envelope(INFO, error={"code": "internal", "message": "x", "retryable": False})),
    "extra-member": http(envelope(INFO, extra=1)),
    "duplicate-keys": http(b'{"protocol": {"major": 1, "minor": 0}, "request_id": "r", "data": {}, "data": {}}'),
    "nan": http(b'{"protocol": {"major": 1, "minor": 0}, "request_id": "r", "data": NaN}'),
    "request-id-header-disagrees": http(envelope(INFO), extra_headers=(("X-Werk-Request-Id", "req_other"),)),
    "error-status-with-data": http(envelope(INFO), status="500 Internal Server Error"),
    "error-without-retryable": http(envelope(error={"code": "internal", "message": "x"}), status="500 Oops"),
    "unknown-error-code": http(error_envelope("teapot"), status="418 Teapot"),
    "data-wrong-shape": http(envelope({"service": "x"})),
}


@pytest.mark.parametrize("name", sorted(MISSING))
def test_missing_or_malformed_envelope_is_a_protocol_violation(name: str) -> None:
    with raw_server(MISSING[name]) as srv, pytest.raises(ProtocolViolationError) as caught:
        client(srv.url).info()
    assert not isinstance(caught.value, WerkApiError)
    assert type(caught.value) in (ProtocolViolationError,)


# -- protocol errors ---------------------------------------------------------------------------
@pytest.mark.parametrize("code", list(ErrorCode))
def test_every_protocol_error_code_maps_to_its_own_class(code: ErrorCode) -> None:
    retryable = code in (ErrorCode.UNAVAILABLE, ErrorCode.RESOURCE_EXHAUSTED)
    raw = http(
        error_envelope(code.value, "it failed", retryable=retryable, request_id="req_abc"),
        status="409 Conflict",
        extra_headers=(("X-Werk-Request-Id", "req_abc"),),
    )
    with raw_server(raw) as srv, pytest.raises(WerkApiError) as caught:
        client(srv.url).info()
    err = caught.value
    assert type(err) is API_ERRORS[code]
    assert (err.code, err.retryable, err.request_id, err.status, err.message) == (
        code.value,
        retryable,
        "req_abc",
        409,
        "it failed",
    )
    assert len(set(API_ERRORS.values())) == len(ErrorCode)


def test_incompatible_state_keeps_only_mismatch_fields() -> None:
    body = envelope(
        error={
            "code": "incompatible_state",
            "message": "m",
            "retryable": False,
            "details": {"mismatch_fields": ["argv"], "path": "/secret"},
        }
    )
    with raw_server(http(body, status="409 Conflict")) as srv, pytest.raises(WerkApiError) as caught:
        client(srv.url).info()
    assert caught.value.details == {"mismatch_fields": ["argv"]}


def test_server_messages_echoing_secrets_are_scrubbed() -> None:
    message = f"bad key {KEY} and handoff {HANDOFF}\x1b[31m"
    raw = http(error_envelope("expired_handoff", message), status="410 Gone")
    with raw_server(raw) as srv, pytest.raises(WerkApiError) as caught:
        client(srv.url).decode(DecodeRequest(handoff=HANDOFF, allow_experimental=True))
    assert_clean(caught.value)
    assert "[redacted]" in caught.value.message
    assert "\x1b" not in caught.value.message
    sent = srv.requests[0].json()
    assert sent["handoff"] == HANDOFF  # the secret is sent plainly on the wire, only there


def test_invalid_decode_data_never_echoes_the_handoff() -> None:
    data = {"text": 5, "handoff": HANDOFF, "completion_tokens": "many", "finish_reason": "stop"}
    with raw_server(http(envelope(data))) as srv, pytest.raises(ProtocolViolationError) as caught:
        client(srv.url).decode(DecodeRequest(handoff="other", allow_experimental=True))
    assert_clean(caught.value)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


# -- transport ---------------------------------------------------------------------------------
def test_connection_refused_is_a_retryable_transport_error() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    with pytest.raises(TransportError) as caught:
        client(f"http://127.0.0.1:{port}").info()
    assert caught.value.retryable and not isinstance(caught.value, ClientTimeoutError)
    assert_clean(caught.value)


def test_a_silent_server_times_out() -> None:
    def silent(sock: socket.socket, stop: threading.Event) -> None:
        stop.wait(10)

    with raw_server(silent) as srv:
        started = time.monotonic()
        with pytest.raises(ClientTimeoutError) as caught:
            client(srv.url, timeout=0.5).info()
        assert time.monotonic() - started < 3
    assert caught.value.retryable


def test_the_timeout_bounds_the_whole_response_not_each_read() -> None:
    body = http(envelope(INFO))

    def drip(sock: socket.socket, stop: threading.Event) -> None:
        for i in range(len(body)):
            if stop.wait(0.05):
                return
            sock.sendall(body[i : i + 1])

    with raw_server(drip) as srv:
        started = time.monotonic()
        with pytest.raises(ClientTimeoutError):
            client(srv.url, timeout=0.6).info()
        assert time.monotonic() - started < 3


def test_every_client_error_is_rooted_at_werk_client_error() -> None:
    for cls in (*API_ERRORS.values(), FramingError, RedirectError, TransportError, RequestTooLargeError):
        assert issubclass(cls, WerkClientError)

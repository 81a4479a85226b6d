"""The protocol surface over a real waitress server on an ephemeral loopback port."""

from __future__ import annotations

import http.client
import json
import logging
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.conftest import KEY
from werk_host.testing.hosts import backend_host, make_host, running


def request(
    base: str,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    chunked: bool = False,
) -> tuple[int, dict[str, str], dict]:
    url = urlsplit(base)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    try:
        if chunked:
            conn.putrequest(method, path)
            for name, value in (headers or {}).items():
                conn.putheader(name, value)
            conn.putheader("Transfer-Encoding", "chunked")
            conn.endheaders()
            data = body or b""
            for i in range(0, len(data), 65536):
                piece = data[i : i + 65536]
                conn.send(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            conn.send(b"0\r\n\r\n")
        else:
            conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        raw = resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, json.loads(raw)
    finally:
        conn.close()


AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture
def server(home: Path):
    host = make_host(home, api_keys=(KEY,))
    with running(host) as base:
        yield base


def check_headers(headers: dict[str, str], body: dict) -> None:
    assert headers["x-werk-protocol-version"] == "1.0"
    assert headers["content-type"] == "application/json"
    assert headers["cache-control"] == "no-store"
    assert headers["vary"] == "accept"
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["x-werk-request-id"] == body["request_id"]
    assert body["protocol"] == {"major": 1, "minor": 0}


def test_auth_over_the_wire(server: str) -> None:
    status, headers, body = request(server, "GET", "/werk/v1/info")
    assert status == 401 and headers["www-authenticate"] == "Bearer"
    check_headers(headers, body)
    assert body["error"]["code"] == "unauthorized"
    status, headers, body = request(server, "GET", "/werk/v1/info", headers={"X-API-Key": KEY})
    assert status == 200 and body["data"]["service"] == "werk-host"
    check_headers(headers, body)


@pytest.mark.parametrize(
    ("extra", "status"),
    [
        ({"Accept": "application/json;q=0"}, 406),
        ({"Accept": "*/*;q=0.5"}, 200),
        ({"X-Werk-Protocol-Version": "1.0, 1.4"}, 200),
        ({"X-Werk-Protocol-Version": "1.0, 2.1"}, 406),
    ],
)
def test_negotiation_over_the_wire(server: str, extra: dict[str, str], status: int) -> None:
    got, headers, body = request(server, "GET", "/werk/v1/capabilities", headers={**AUTH, **extra})
    assert got == status
    check_headers(headers, body)
    if status == 406:
        assert body["error"]["code"] == "incompatible_protocol"


def test_headers_on_404_and_405(server: str) -> None:
    for method, path, status in (("GET", "/werk/v1/missing", 404), ("PUT", "/werk/v1/states", 405)):
        got, headers, body = request(server, method, path, body=b"{}" if method == "PUT" else None, headers=AUTH)
        assert got == status
        check_headers(headers, body)
        assert "error" in body


@pytest.mark.parametrize("chunked", [False, True])
def test_body_bound_with_and_without_content_length(server: str, chunked: bool) -> None:
    big = b'{"x":"' + b"a" * (1 << 20) + b'"}'
    status, headers, body = request(server, "POST", "/werk/v1/states/prune", big, AUTH, chunked=chunked)
    assert status == 413
    check_headers(headers, body)
    assert body["error"]["code"] == "resource_exhausted"
    small = json.dumps({"selector": {"kind": "all", "confirm": True}}).encode()
    status, _, body = request(server, "POST", "/werk/v1/states/prune", small, AUTH, chunked=chunked)
    assert status == 200, body
    assert body["data"] == {"matched": 0, "removed": 0, "bytes": 0, "dry_run": True}


def test_keys_and_handoffs_never_reach_logs(home: Path, caplog: pytest.LogCaptureFixture) -> None:
    host, _plugin = backend_host(home, api_keys=(KEY,))
    with caplog.at_level(logging.DEBUG), running(host) as base:
        request(base, "GET", "/werk/v1/info", headers={"Authorization": "Bearer wrong-key-xyz"})
        status, _, body = request(
            base,
            "POST",
            "/werk/v1/prefill",
            json.dumps(
                {"model_id": "tiny", "input": {"type": "text", "text": "a b c"}, "allow_experimental": True}
            ).encode(),
            AUTH,
        )
        assert status == 200, body
        handoff = body["data"]["handoff"]
        status, _, body = request(
            base, "POST", "/werk/v1/decode", json.dumps({"handoff": handoff, "allow_experimental": True}).encode(), AUTH
        )
        assert status == 200
        request(
            base, "POST", "/werk/v1/decode", json.dumps({"handoff": handoff, "allow_experimental": True}).encode(), AUTH
        )
    text = caplog.text + repr(host.config) + repr(host.auth)
    assert KEY not in text
    assert "wrong-key-xyz" not in text
    assert handoff not in text

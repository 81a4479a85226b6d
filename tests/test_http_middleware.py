"""Every middleware branch and the envelope, through falcon.testing (no socket)."""

from __future__ import annotations

import json
import logging

import falcon.testing
import pytest

from tests.conftest import KEY
from werk_host.errors import ErrorCode
from werk_host.http.errors import STATUS
from werk_host.http.middleware import accept_allows_json, versions_consumable
from werk_host.server import Host

PROTOCOL_HEADERS = {
    "x-werk-protocol-version": "1.0",
    "content-type": "application/json",
    "cache-control": "no-store",
    "vary": "accept",
    "x-content-type-options": "nosniff",
}


def assert_protocol_response(result: falcon.testing.Result) -> dict:
    for name, value in PROTOCOL_HEADERS.items():
        assert result.headers.get(name) == value, name
    body = result.json
    assert body["protocol"] == {"major": 1, "minor": 0}
    assert body["request_id"].startswith("req_")
    assert result.headers["x-werk-request-id"] == body["request_id"]
    assert ("data" in body) != ("error" in body)
    return body


def assert_error(result: falcon.testing.Result, status: int, code: str) -> dict:
    assert result.status_code == status, result.text
    body = assert_protocol_response(result)
    assert body["error"]["code"] == code
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert isinstance(body["error"]["retryable"], bool)
    return body["error"]


def test_every_error_code_has_the_seed_status() -> None:
    expected = {
        "invalid_request": 400,
        "incompatible_protocol": 406,
        "unauthorized": 401,
        "forbidden": 403,
        "not_found": 404,
        "conflict": 409,
        "incompatible_state": 409,
        "expired_handoff": 410,
        "experimental_opt_in_required": 428,
        "resource_exhausted": 429,
        "unsupported": 501,
        "unavailable": 503,
        "corrupt_state": 500,
        "internal": 500,
    }
    assert {c.value: s for c, s in STATUS.items()} == expected
    assert set(STATUS) == set(ErrorCode)


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong"}, {"X-API-Key": "wrong"}, {"Authorization": "Basic " + KEY}],
)
def test_unauthorized_carries_challenge_and_envelope(bare_host: Host, headers: dict[str, str]) -> None:
    result = falcon.testing.TestClient(bare_host.app).simulate_get("/werk/v1/info", headers=headers)
    assert_error(result, 401, "unauthorized")
    assert result.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize(
    "headers", [{"Authorization": f"Bearer {KEY}"}, {"authorization": f"bearer {KEY}"}, {"X-API-Key": KEY}]
)
def test_both_key_headers_are_accepted(bare_host: Host, headers: dict[str, str]) -> None:
    result = falcon.testing.TestClient(bare_host.app).simulate_get("/werk/v1/info", headers=headers)
    assert result.status_code == 200
    assert assert_protocol_response(result)["data"]["service"] == "werk-host"


@pytest.mark.parametrize(
    ("accept", "ok"),
    [
        (None, True),
        ("application/json", True),
        ("application/*", True),
        ("*/*", True),
        ("text/html, application/json;q=0.1", True),
        ("text/html", False),
        ("application/json;q=0", False),
        ("application/json;q=0, */*", False),
        ("*/*;q=0", False),
        ("application/xml", False),
        ("application/json;q=abc", False),
        ("application/*;q=0.000", False),
    ],
)
def test_accept_negotiation(bare_client: falcon.testing.TestClient, accept: str | None, ok: bool) -> None:
    assert accept_allows_json(accept) is ok
    headers = {"Accept": accept} if accept is not None else {}
    result = bare_client.simulate_get("/werk/v1/info", headers=headers)
    if ok:
        assert result.status_code == 200
    else:
        assert_error(result, 406, "incompatible_protocol")


@pytest.mark.parametrize(
    ("version", "ok"),
    [
        (None, True),
        ("1.0", True),
        ("1.7", True),
        ("1.0, 1.2", True),
        ("2.0", False),
        ("0.9", False),
        ("1.0, 2.0", False),
        ("1", False),
        ("abc", False),
        ("", False),
        ("1.0,", False),
    ],
)
def test_version_negotiation(bare_client: falcon.testing.TestClient, version: str | None, ok: bool) -> None:
    assert versions_consumable(version) is ok
    headers = {"X-Werk-Protocol-Version": version} if version is not None else {}
    result = bare_client.simulate_get("/werk/v1/info", headers=headers)
    if ok:
        assert result.status_code == 200
    else:
        assert_error(result, 406, "incompatible_protocol")


def test_404_and_405_use_the_envelope(bare_client: falcon.testing.TestClient) -> None:
    assert_error(bare_client.simulate_get("/werk/v1/nope"), 404, "not_found")
    result = bare_client.simulate_delete("/werk/v1/info")
    assert_error(result, 405, "invalid_request")


def test_body_bound_with_content_length(bare_client: falcon.testing.TestClient) -> None:
    body = b"{" + b" " * (1 << 20) + b"}"
    result = bare_client.simulate_post("/werk/v1/prefill", body=body, headers={"Content-Type": "application/json"})
    error = assert_error(result, 413, "resource_exhausted")
    assert error["retryable"] is False


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"{not json", "malformed JSON"),
        (b"[]", "JSON object"),
        (b"", "required"),
        (b'{"model_id":"tiny","input":{"type":"text","text":"x"},"surprise":1}', "surprise"),
        (b'{"model_id":"tiny","input":{"type":"text","text":"x"},"policy":{"ttl_seconds":0}}', "ttl_seconds"),
        (b'{"model_id":"tiny","input":{"type":"messages","messages":[]}}', "messages"),
    ],
)
def test_malformed_and_invalid_bodies(bare_client: falcon.testing.TestClient, body: bytes, fragment: str) -> None:
    error = assert_error(bare_client.simulate_post("/werk/v1/prefill", body=body), 400, "invalid_request")
    assert fragment in error["message"]


def test_validation_errors_never_echo_submitted_values(bare_client: falcon.testing.TestClient) -> None:
    secret = "wh_" + "S" * 40
    body = json.dumps({"handoff": secret, "max_tokens": 0}).encode()
    result = bare_client.simulate_post("/werk/v1/decode", body=body)
    assert_error(result, 400, "invalid_request")
    assert secret not in result.text


def test_unexpected_exception_is_internal_with_stable_message(
    bare_host: Host,
    bare_client: falcon.testing.TestClient,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def explode(principal: object) -> None:
        raise RuntimeError("secret backend detail /home/user/.werk")

    monkeypatch.setattr(bare_host.service, "info", explode)
    with caplog.at_level(logging.ERROR):
        result = bare_client.simulate_get("/werk/v1/info")
    error = assert_error(result, 500, "internal")
    assert error["message"] == "an internal control-plane operation failed"
    assert "secret backend detail" not in result.text and "/home" not in result.text
    assert "secret backend detail" in caplog.text  # detail only in the server log


def test_info_and_capabilities_without_adapter(bare_client: falcon.testing.TestClient) -> None:
    info = assert_protocol_response(bare_client.simulate_get("/werk/v1/info"))["data"]
    assert info["active_backend"] is None
    assert info["service"] == "werk-host"
    assert info["limits"] == {
        "max_page_size": 100,
        "max_state_ids_per_operation": 100,
        "max_expert_ids_per_operation": 256,
        "max_request_bytes": 1048576,
        "max_handoff_bytes": 4096,
        "max_ttl_seconds": 2592000,
    }
    caps = {c["id"]: c for c in assert_protocol_response(bare_client.simulate_get("/werk/v1/capabilities"))["data"]}
    assert caps["runtime.memory.telemetry.host"]["status"] == "supported"  # psutil samples this host
    for cap_id in (
        "runtime.pd.prefill",
        "runtime.state.persistence",
        "api.chat.token_count",
        "runtime.model_residency",
    ):
        assert caps[cap_id]["status"] == "unsupported"
    assert caps["runtime.memory.reservations"]["status"] == "unavailable"


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        (
            "POST",
            "/werk/v1/prefill",
            {"model_id": "tiny", "input": {"type": "text", "text": "hi"}, "allow_experimental": True},
        ),
        ("POST", "/werk/v1/chat/count_tokens", {"messages": [{"role": "user", "content": "hi"}]}),
        ("GET", "/werk/v1/chat/limits", None),
        ("GET", "/werk/v1/chat/reasoning", None),
        ("GET", "/werk/v1/experts", None),
        (
            "POST",
            "/werk/v1/experts/actions",
            {"model_id": "m", "expert_ids": ["e"], "action": "pin", "allow_experimental": True},
        ),
    ],
)
def test_operations_without_adapter_are_unsupported(
    bare_client: falcon.testing.TestClient, method: str, path: str, body: dict | None
) -> None:
    result = bare_client.simulate_request(method, path, body=json.dumps(body).encode() if body else None)
    assert_error(result, 501, "unsupported")


def test_decode_with_unknown_handoff_is_expired(client: falcon.testing.TestClient) -> None:
    body = json.dumps({"handoff": "wh_nope", "allow_experimental": True}).encode()
    assert_error(client.simulate_post("/werk/v1/decode", body=body), 410, "expired_handoff")


def test_states_list_empty_and_forged_cursor(bare_client: falcon.testing.TestClient) -> None:
    page = assert_protocol_response(bare_client.simulate_get("/werk/v1/states"))["data"]
    assert page == {"states": [], "next_cursor": None}
    assert_error(bare_client.simulate_get("/werk/v1/states", params={"cursor": "abc.def"}), 400, "invalid_request")
    assert_error(bare_client.simulate_get("/werk/v1/states", params={"limit": "101"}), 400, "invalid_request")
    assert_error(bare_client.simulate_get("/werk/v1/states", params={"bogus": "1"}), 400, "invalid_request")


def test_deployments_and_openapi_are_enveloped(bare_client: falcon.testing.TestClient) -> None:
    data = assert_protocol_response(bare_client.simulate_get("/werk/v1/deployments"))["data"]
    assert data == {"inventory": [], "plans": [], "slots": []}
    doc = assert_protocol_response(bare_client.simulate_get("/werk/v1/openapi.json"))["data"]
    assert doc["openapi"] == "3.1.0"
    assert "/werk/v1/prefill" in doc["paths"]


def test_openapi_needs_auth(bare_host: Host) -> None:
    result = falcon.testing.TestClient(bare_host.app).simulate_get("/werk/v1/openapi.json")
    assert_error(result, 401, "unauthorized")

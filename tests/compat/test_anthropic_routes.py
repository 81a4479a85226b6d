"""``/v1/messages`` over the reference backend: the translation meets admission, routing,
counting and the counters of the ``/v1`` path, and every error is Anthropic's shape."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import falcon.testing
import pytest

from tests.compat.conftest import KEY
from werk_host import hookimpl
from werk_host.seam import InferenceResponse, JsonObject
from werk_host.server import Host
from werk_host.testing.hosts import make_host
from werk_host.testing.reference import MAX_OUTPUT_TOKENS, PLUGIN_NAME, MemoryAdapter, MemoryBackendPlugin

HEADERS = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
CONVERSATION: list[dict[str, Any]] = [
    {"role": "user", "content": "name three colours"},
    {"role": "assistant", "content": [{"type": "text", "text": "red green blue"}]},
    {"role": "user", "content": "and three more please"},
]


def _post(client: falcon.testing.TestClient, path: str, body: object, **headers: str) -> falcon.testing.Result:
    return client.simulate_post(path, json=body, headers={**HEADERS, **headers})


def _body(**extra: Any) -> dict[str, Any]:
    return {"model": "tiny", "max_tokens": 16, "system": "be brief", "messages": CONVERSATION, **extra}


def _events(text: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in text.strip().split("\n\n"):
        name, data = block.split("\n")
        out.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


def _count(client: falcon.testing.TestClient, **extra: Any) -> int:
    body = {k: v for k, v in _body(**extra).items() if k != "max_tokens"}
    result = _post(client, "/v1/messages/count_tokens", body)
    assert result.status_code == 200, result.text
    assert set(result.json) == {"input_tokens"}
    count: int = result.json["input_tokens"]
    return count


def _anthropic_error(result: falcon.testing.Result, status: int, kind: str) -> str:
    assert result.status_code == status, result.text
    body = result.json
    assert body["type"] == "error" and body["error"]["type"] == kind, body
    assert body["request_id"].startswith("req_") and result.headers["request-id"] == body["request_id"]
    message: str = body["error"]["message"]
    return message


def test_a_message_answers_with_exact_usage_and_the_serving_instance(client: falcon.testing.TestClient) -> None:
    result = _post(client, "/v1/messages", _body())
    assert result.status_code == 200, result.text
    doc = result.json
    assert doc["type"] == "message" and doc["role"] == "assistant" and doc["model"] == "tiny"
    assert doc["content"] == [{"type": "text", "text": "and three more please"}]  # the reference echoes
    assert doc["stop_reason"] == "end_turn" and doc["stop_sequence"] is None
    assert doc["usage"] == {"input_tokens": _count(client), "output_tokens": 4}
    assert result.headers["x-werk-deployment"] == "tiny"


def test_a_streamed_message_follows_anthropics_event_sequence(client: falcon.testing.TestClient) -> None:
    result = _post(client, "/v1/messages", _body(stream=True, max_tokens=2))
    assert result.status_code == 200 and result.headers["content-type"] == "text/event-stream"
    events = _events(result.text)
    assert [n for n, _ in events] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta") == "and three"
    assert events[-2][1]["delta"]["stop_reason"] == "max_tokens"
    assert events[-2][1]["usage"] == {"input_tokens": _count(client), "output_tokens": 2}


def test_counters_and_metrics_count_anthropic_requests(client: falcon.testing.TestClient) -> None:
    auth = {"Authorization": f"Bearer {KEY}"}
    before = client.simulate_get("/werk/v1/observability", headers=auth).json["data"]["chat"]
    _post(client, "/v1/messages", _body())
    _post(client, "/v1/messages", _body(stream=True))
    after = client.simulate_get("/werk/v1/observability", headers=auth).json["data"]["chat"]
    count = _count(client)
    assert after["requests_total"] == before["requests_total"] + 2 and after["requests_active"] == 0
    assert after["prompt_tokens_total"] == before["prompt_tokens_total"] + 2 * count
    assert after["completion_tokens_total"] == before["completion_tokens_total"] + 8
    metrics = client.simulate_get("/metrics", headers=auth).text
    assert 'werk_chat_requests_total{instance="tiny"} 2.0' in metrics
    assert 'route="/v1/messages"' in metrics


def test_keys_as_anthropic_clients_send_them(client: falcon.testing.TestClient) -> None:
    body = _body()
    assert client.simulate_post("/v1/messages", json=body, headers={"x-api-key": KEY}).status_code == 200
    bearer = {"Authorization": f"Bearer {KEY}", "anthropic-version": "2099-01-01", "anthropic-beta": "anything"}
    assert client.simulate_post("/v1/messages", json=body, headers=bearer).status_code == 200
    for headers in ({}, {"x-api-key": "sk-wrong"}, {"anthropic-version": "2023-06-01"}):
        result = client.simulate_post("/v1/messages", json=body, headers=headers)
        _anthropic_error(result, 401, "authentication_error")
    result = client.simulate_post("/v1/messages/count_tokens", json=body)
    _anthropic_error(result, 401, "authentication_error")


@pytest.mark.parametrize(
    ("body", "status", "kind", "fragment"),
    [
        (_body(max_tokens=None), 400, "invalid_request_error", "max_tokens"),
        (_body(messages=[{"role": "user", "content": [{"type": "image"}]}]), 400, "invalid_request_error", "source"),
        (_body(tools=[{"name": "x"}]), 400, "invalid_request_error", "input_schema"),
        (_body(model="nope"), 404, "not_found_error", "not served"),
        (_body(messages=[{"role": "user", "content": "word " * 70}]), 400, "invalid_request_error", "context"),
    ],
)
def test_bad_input_is_anthropics_4xx(
    client: falcon.testing.TestClient, body: dict[str, Any], status: int, kind: str, fragment: str
) -> None:
    before = client.simulate_get("/werk/v1/observability", headers=HEADERS).json["data"]["chat"]["requests_total"]
    message = _anthropic_error(_post(client, "/v1/messages", body), status, kind)
    assert fragment in message
    after = client.simulate_get("/werk/v1/observability", headers=HEADERS).json["data"]["chat"]["requests_total"]
    assert after == before  # refused before anything reached the backend


def test_count_tokens_errors_and_routes(client: falcon.testing.TestClient) -> None:
    _anthropic_error(
        _post(client, "/v1/messages/count_tokens", {"model": "nope", "messages": CONVERSATION}), 404, "not_found_error"
    )
    _anthropic_error(_post(client, "/v1/messages/count_tokens", {"model": "tiny"}), 400, "invalid_request_error")
    _anthropic_error(_post(client, "/v1/messages/batches", {}), 404, "not_found_error")
    _anthropic_error(client.simulate_get("/v1/messages", headers=HEADERS), 405, "invalid_request_error")
    raw = client.simulate_post(
        "/v1/messages", body=b"{not json", headers={**HEADERS, "content-type": "application/json"}
    )
    _anthropic_error(raw, 400, "invalid_request_error")


class FailingAdapter(MemoryAdapter):
    """The reference adapter whose chat answers a raw 500 naming a file, as a broken server might."""

    @hookimpl(specname="werk_chat_completion")
    def chat_completion(self, request: JsonObject) -> InferenceResponse:
        body = b'{"error": {"message": "ggml_abort at /srv/secret/model.gguf"}}'
        return InferenceResponse(500, {"Content-Type": "application/json"}, iter([body]), lambda: None)


class FailingBackend(MemoryBackendPlugin):
    """The reference backend with :class:`FailingAdapter`."""

    adapter_class = FailingAdapter


@pytest.fixture
def failing(tmp_path: Path) -> Iterator[Host]:
    home = tmp_path / "failing"
    home.mkdir()
    host = make_host(home, plugin=FailingBackend(), plugin_name=PLUGIN_NAME, api_keys=(KEY,))
    try:
        yield host
    finally:
        host.close()


def test_backend_failures_are_anthropic_errors_without_backend_text(failing: Host) -> None:
    client = falcon.testing.TestClient(failing.app)
    for stream in (False, True):
        result = _post(client, "/v1/messages", _body(stream=stream))
        message = _anthropic_error(result, 502, "api_error")
        assert message == "the backend failed to process the request"
        assert "secret" not in result.text and "gguf" not in result.text


def test_max_tokens_above_the_ceiling_is_clamped_not_refused(client: falcon.testing.TestClient) -> None:
    """What was ``output_limit_exceeded`` here is now the output budget (docs/compat.md)."""
    result = _post(client, "/v1/messages", _body(max_tokens=MAX_OUTPUT_TOKENS + 1))
    assert result.status_code == 200, result.text
    assert int(result.headers["x-werk-max-tokens-applied"]) <= MAX_OUTPUT_TOKENS

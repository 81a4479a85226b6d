"""``/v1/responses`` over the reference backend: the translation meets admission, routing,
counting and the counters of the ``/v1`` path; errors are OpenAI's shape; the openai SDK's
``responses.create`` and ``responses.stream`` read the answers (a real waitress server)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import falcon.testing
import openai
import pytest

from tests.compat.conftest import KEY
from tests.compat.test_anthropic_routes import FailingBackend
from werk_host import hookimpl
from werk_host.compat.responses import ResponsesRequest, chat_body
from werk_host.protocol import CapabilityId, CapabilityStatus
from werk_host.seam import InferenceResponse, JsonObject
from werk_host.server import Host
from werk_host.testing.hosts import make_host
from werk_host.testing.reference import (
    CONTEXT_TOKENS,
    EXPERIMENTAL_STATE,
    MAX_OUTPUT_TOKENS,
    PLUGIN_NAME,
    MemoryAdapter,
    MemoryBackendPlugin,
)

HEADERS = {"Authorization": f"Bearer {KEY}"}
CODEX_FIRST = Path(__file__).parent / "fixtures" / "agents" / "codex_responses.json"
INPUT: list[dict[str, Any]] = [
    {"role": "user", "content": "name three colours"},
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "red green blue"}]},
    {"role": "user", "content": [{"type": "input_text", "text": "and three more please"}]},
]


def _body(**extra: Any) -> dict[str, Any]:
    return {"model": "tiny", "instructions": "be brief", "input": INPUT, "max_output_tokens": 16, **extra}


def _post(client: falcon.testing.TestClient, body: object, **headers: str) -> falcon.testing.Result:
    return client.simulate_post("/v1/responses", json=body, headers={**HEADERS, **headers})


def _count(client: falcon.testing.TestClient, body: dict[str, Any]) -> int:
    """Werk's own count of the chat request ``body`` translates to."""
    chat = chat_body(ResponsesRequest.model_validate(body))
    counted = {k: v for k, v in chat.items() if k in ("model", "messages", "tools", "tool_choice")}
    result = client.simulate_post("/werk/v1/chat/count_tokens", json=counted, headers=HEADERS)
    assert result.status_code == 200, result.text
    tokens: int = result.json["data"]["input_tokens"]
    return tokens


def _events(text: str) -> list[dict[str, Any]]:
    out = []
    for block in text.strip().split("\n\n"):
        name, data = block.split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert name == f"event: {event['type']}"
        out.append(event)
    return out


def _openai_error(result: falcon.testing.Result, status: int, kind: str) -> dict[str, Any]:
    assert result.status_code == status, result.text
    error: dict[str, Any] = result.json["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == kind, error
    return error


def test_a_response_answers_with_exact_usage_and_the_serving_instance(client: falcon.testing.TestClient) -> None:
    result = _post(client, _body())
    assert result.status_code == 200, result.text
    doc = result.json
    assert doc["object"] == "response" and doc["status"] == "completed" and doc["model"] == "tiny"
    assert [item["type"] for item in doc["output"]] == ["message"]
    assert doc["output"][0]["content"][0]["text"] == "and three more please"  # the reference echoes
    assert doc["usage"]["input_tokens"] == _count(client, _body()) and doc["usage"]["output_tokens"] == 4
    assert result.headers["x-werk-deployment"] == "tiny"


def test_a_streamed_response_ends_with_the_whole_response(client: falcon.testing.TestClient) -> None:
    result = _post(client, _body(stream=True, max_output_tokens=2))
    assert result.status_code == 200 and result.headers["content-type"] == "text/event-stream"
    events = _events(result.text)
    assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.incomplete"
    final = events[-1]["response"]
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert final["output"][0]["content"][0]["text"] == deltas == "and three"
    assert final["usage"]["input_tokens"] == _count(client, _body()) and final["usage"]["output_tokens"] == 2


def test_codex_first_request_shape_streams_to_completion(client: falcon.testing.TestClient) -> None:
    """Codex's recorded body (its tools, namespace and web_search included) with a short input:
    the reference backend's context is 64 tokens."""
    body = json.loads(CODEX_FIRST.read_text())["body"]
    body["input"] = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "say hi"}]}]
    body["model"] = "tiny"  # recorded against the demo instance
    result = _post(client, body)
    assert result.status_code == 200, result.text
    events = _events(result.text)
    assert events[-1]["type"] == "response.completed", events[-1]
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == "say hi"
    assert len(events[-1]["response"]["tools"]) == len(body["tools"])  # echoed as sent


def test_max_output_tokens_is_an_upper_bound_clamped_to_the_instance(client: falcon.testing.TestClient) -> None:
    result = _post(client, _body(max_output_tokens=1 << 20))
    assert result.status_code == 200, result.text
    # the ceiling, or what the context leaves after the input when that is less
    expected = min(MAX_OUTPUT_TOKENS, CONTEXT_TOKENS - _count(client, _body()))
    assert int(result.headers["x-werk-max-tokens-applied"]) == expected
    assert result.json["max_output_tokens"] == 1 << 20  # the request's own value, echoed
    assert "x-werk-max-tokens-applied" not in _post(client, _body(max_output_tokens=4)).headers


def test_counters_and_metrics_count_responses_requests(client: falcon.testing.TestClient) -> None:
    before = client.simulate_get("/werk/v1/observability", headers=HEADERS).json["data"]["chat"]
    _post(client, _body())
    _post(client, _body(stream=True))
    after = client.simulate_get("/werk/v1/observability", headers=HEADERS).json["data"]["chat"]
    count = _count(client, _body())
    assert after["requests_total"] == before["requests_total"] + 2 and after["requests_active"] == 0
    assert after["prompt_tokens_total"] == before["prompt_tokens_total"] + 2 * count
    assert after["completion_tokens_total"] == before["completion_tokens_total"] + 8
    metrics = client.simulate_get("/metrics", headers=HEADERS).text
    assert 'werk_chat_requests_total{instance="tiny"} 2.0' in metrics
    assert 'route="/v1/responses"' in metrics


@pytest.mark.parametrize(
    ("body", "status", "kind", "fragment"),
    [
        (_body(store=True), 400, "invalid_request_error", "store: true"),
        (_body(previous_response_id="resp_1"), 400, "invalid_request_error", "previous_response_id"),
        (
            _body(tools=[{"type": "code_interpreter", "container": "c"}]),
            400,
            "invalid_request_error",
            "code_interpreter",
        ),
        (_body(tool_choice="required"), 400, "invalid_request_error", "needs at least one function tool"),
        (_body(input=[{"role": "user", "content": "word " * 70}]), 400, "invalid_request_error", "context"),
        (_body(model="nope"), 404, "not_found_error", "nope"),
        (_body(unknown_field=1), 400, "invalid_request_error", "unknown_field"),
    ],
)
def test_bad_input_is_an_openai_4xx_before_the_backend(
    client: falcon.testing.TestClient, body: dict[str, Any], status: int, kind: str, fragment: str
) -> None:
    before = client.simulate_get("/werk/v1/observability", headers=HEADERS).json["data"]["chat"]["requests_total"]
    assert fragment in _openai_error(_post(client, body), status, kind)["message"]
    after = client.simulate_get("/werk/v1/observability", headers=HEADERS).json["data"]["chat"]["requests_total"]
    assert after == before


def test_keys_and_methods(client: falcon.testing.TestClient) -> None:
    _openai_error(client.simulate_post("/v1/responses", json=_body()), 401, "authentication_error")
    _openai_error(client.simulate_get("/v1/responses", headers=HEADERS), 405, "invalid_request_error")
    raw = client.simulate_post("/v1/responses", body=b"{", headers={**HEADERS, "content-type": "application/json"})
    _openai_error(raw, 400, "invalid_request_error")


@pytest.fixture
def failing(tmp_path: Path) -> Iterator[Host]:
    home = tmp_path / "failing"
    home.mkdir()
    host = make_host(home, plugin=FailingBackend(), plugin_name=PLUGIN_NAME, api_keys=(KEY,))
    try:
        yield host
    finally:
        host.close()


def test_backend_failures_are_openai_errors_without_backend_text(failing: Host) -> None:
    client = falcon.testing.TestClient(failing.app)
    for stream in (False, True):
        result = _post(client, _body(stream=stream))
        error = _openai_error(result, 502, "server_error")
        assert error["message"] == "the backend failed to process the request" and error["code"] == "backend_error"
        assert "secret" not in result.text and "gguf" not in result.text


# -- the openai SDK ------------------------------------------------------------------------------------


def test_the_openai_sdk_reads_answers_and_streams(served: str) -> None:
    with openai.OpenAI(base_url=f"{served}/v1", api_key=KEY, max_retries=0, timeout=60) as client:
        answer = client.responses.create(model="tiny", instructions="be brief", input=INPUT, max_output_tokens=16)
        assert answer.output_text == "and three more please" and answer.status == "completed"
        events = list(client.responses.create(model="tiny", input=INPUT, max_output_tokens=16, stream=True))
        assert events[-1].type == "response.completed"
        streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        with client.responses.stream(model="tiny", input="hello world", max_output_tokens=16) as stream:
            texts = [e.delta for e in stream if e.type == "response.output_text.delta"]
            final = stream.get_final_response()
        with pytest.raises(openai.BadRequestError) as refused:
            client.responses.create(model="tiny", input="hi", store=True)
        with pytest.raises(openai.NotFoundError):
            client.responses.create(model="nope", input="hi")
    assert streamed == answer.output_text
    assert "".join(texts) == final.output_text == "hello world"
    assert final.usage is not None and final.usage.output_tokens == 2
    assert "store" in refused.value.message


# -- reasoning effort ----------------------------------------------------------------------------------


class RecordingAdapter(MemoryAdapter):
    """The reference adapter, keeping the chat bodies it is given."""

    seen: list[JsonObject] = []

    @hookimpl(specname="werk_chat_completion")
    def chat_completion(self, request: JsonObject) -> InferenceResponse:
        self.seen.append(request)
        return super().chat_completion(request)


class RecordingBackend(MemoryBackendPlugin):
    adapter_class = RecordingAdapter


@pytest.mark.parametrize("reasoning", [True, False], ids=["verified-profile", "no-profile"])
def test_reasoning_effort_is_a_tier_only_where_the_profile_offers_it(tmp_path: Path, reasoning: bool) -> None:
    """The reference profile offers only tier ``none`` for this output (the others need room for
    their budget): ``effort: "none"`` is forwarded as that tier, ``"low"`` and ``"high"`` are
    ignored; without a verified profile every effort is ignored."""
    statuses = {**EXPERIMENTAL_STATE, CapabilityId.REASONING: CapabilityStatus.SUPPORTED} if reasoning else None
    plugin = RecordingBackend(statuses=statuses) if statuses else RecordingBackend()
    host = make_host(tmp_path, plugin=plugin, plugin_name=PLUGIN_NAME, api_keys=(KEY,))
    RecordingAdapter.seen.clear()
    try:
        client = falcon.testing.TestClient(host.app)
        for effort in ("none", "low", "high"):
            assert _post(client, _body(reasoning={"effort": effort, "summary": "auto"})).status_code == 200
    finally:
        host.close()
    tiers = [(body.get("werk") or {}).get("reasoning", {}).get("tier") for body in RecordingAdapter.seen]
    assert tiers == (["none", None, None] if reasoning else [None, None, None])

"""``GET /metrics``: Prometheus text, authenticated, per-app registry, no ids in labels.

Against a real host on waitress around the reference in-memory backend; the scrape is parsed
with ``prometheus_client``'s own parser.
"""

from __future__ import annotations

import http.client
import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import KEY
from werk_host.http.metrics import INSTANCE_STATES, NO_INSTANCE, UNMATCHED, HostMetrics
from werk_host.protocol import MemoryCounters
from werk_host.server import Host
from werk_host.service.counters import DEFAULT_INSTANCE, ChatStats
from werk_host.testing.api import Api
from werk_host.testing.hosts import backend_host, running

Sample = tuple[str, dict[str, str], float]


@pytest.fixture
def live(home: Path) -> Iterator[tuple[Host, str]]:
    host, _plugin = backend_host(home, api_keys=(KEY,))
    with running(host) as base:
        yield host, base


def raw(base: str, method: str, path: str, *, key: str | None, body: object = None) -> tuple[int, str, bytes]:
    """(status, content type, body bytes) of one request."""
    port = int(base.rsplit(":", 1)[1])
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.getheader("Content-Type") or "", resp.read()
    finally:
        conn.close()


def scrape(base: str) -> tuple[dict[str, str], list[Sample]]:
    """(family name → type, every sample) of one authenticated scrape."""
    status, content_type, body = raw(base, "GET", "/metrics", key=KEY)
    assert status == 200, body
    assert content_type == CONTENT_TYPE_LATEST
    types: dict[str, str] = {}
    samples: list[Sample] = []
    for family in text_string_to_metric_families(body.decode()):
        types[family.name] = family.type
        samples.extend((s.name, dict(s.labels), s.value) for s in family.samples)
    return types, samples


def total(samples: list[Sample], name: str, **labels: str) -> float:
    """Sum of ``name``'s samples whose labels include ``labels`` (over every other label)."""
    return sum(v for n, lab, v in samples if n == name and labels.items() <= lab.items())


def by_instance(samples: list[Sample], name: str) -> dict[str, float]:
    return {lab["instance"]: v for n, lab, v in samples if n == name}


def test_metrics_need_a_key_and_answer_the_protocol_error_envelope(live: tuple[Host, str]) -> None:
    _host, base = live
    for key in (None, "sk-wrong-key-0000000000"):
        status, content_type, body = raw(base, "GET", "/metrics", key=key)
        assert status == 401
        assert content_type.startswith("application/json")
        envelope = json.loads(body)
        assert envelope["error"]["code"] == "unauthorized"
        assert envelope["request_id"].startswith("req_") and envelope["protocol"]["major"] == 1
    status, _ct, body = raw(base, "POST", "/metrics", key=KEY, body={})
    assert status == 405 and json.loads(body)["request_id"].startswith("req_")


def _sse_usage(body: bytes) -> dict[str, int]:
    usage: dict[str, int] = {}
    for line in body.decode().splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            usage = json.loads(line[6:]).get("usage") or usage
    return usage


def test_scrape_counts_requests_by_route_template_tokens_states_and_memory(live: tuple[Host, str]) -> None:
    host, base = live
    api = Api(base, KEY)
    made: Counter[tuple[str, str, str]] = Counter()  # (route, method, status) → requests

    secrets: list[str] = [KEY]
    for text in ("the quick brown fox", "jumps over the lazy dog"):
        status, body = api.post(
            "/werk/v1/prefill",
            {"model_id": "tiny", "input": {"type": "text", "text": text}, "allow_experimental": True},
        )
        assert status == 200, body
        secrets += [body["data"]["handoff"], body["data"]["state_id"]]
        made["/werk/v1/prefill", "POST", "200"] += 1
    state_id = secrets[2]
    status, body = api.post(f"/werk/v1/states/{state_id}/actions", {"action": "pin"})
    assert status == 200, body
    made["/werk/v1/states/{state_id}/actions", "POST", "200"] += 1
    missing = "st_" + "0" * 32
    secrets.append(missing)
    status, body = api.post(f"/werk/v1/states/{missing}/actions", {"action": "pin"})
    assert status == 404, body
    made["/werk/v1/states/{state_id}/actions", "POST", "404"] += 1
    status, body = api.get("/werk/v1/no/such/route")
    assert status == 404, body
    made[UNMATCHED, "GET", "404"] += 1
    status, body = api.as_key(None).get("/werk/v1/info")
    assert status == 401, body
    made["/werk/v1/info", "GET", "401"] += 1
    status, body = api.get("/werk/v1/states")
    assert status == 200, body
    stored_bytes = sum(s["bytes"] or 0 for s in body["data"]["states"])
    made["/werk/v1/states", "GET", "200"] += 1

    chat = {"model": "tiny", "messages": [{"role": "user", "content": "say hello to the metrics"}], "max_tokens": 5}
    status, _ct, reply = raw(base, "POST", "/v1/chat/completions", key=KEY, body=chat)
    assert status == 200, reply
    usage = json.loads(reply)["usage"]
    made["/v1/chat/completions", "POST", "200"] += 1
    streamed = {**chat, "stream": True, "stream_options": {"include_usage": True}}
    status, content_type, reply = raw(base, "POST", "/v1/chat/completions", key=KEY, body=streamed)
    assert status == 200 and content_type.startswith("text/event-stream"), reply
    stream_usage = _sse_usage(reply)
    assert stream_usage["prompt_tokens"] > 0
    made["/v1/chat/completions", "POST", "200"] += 1
    status, _ct, _body = raw(base, "GET", "/metrics", key=None)
    assert status == 401
    made["/metrics", "GET", "401"] += 1

    types, samples = scrape(base)

    # requests: exact counts per (route template, method, status); the scrape itself is not yet counted
    seen: Counter[tuple[str, str, str]] = Counter()
    for name, labels, value in samples:
        if name == "werk_http_requests_total":
            assert labels["instance"]  # the selected instance, or NO_INSTANCE
            if labels["route"] == "/metrics":
                assert labels["instance"] == NO_INSTANCE  # selects no instance
            seen[labels["route"], labels["method"], labels["status"]] += int(value)
    assert seen == made
    assert types["werk_http_requests"] == "counter"
    assert types["werk_http_request_duration_seconds"] == "histogram"
    for route in {route for route, _m, _s in made}:
        count = total(samples, "werk_http_request_duration_seconds_count", route=route)
        assert count == sum(n for (r, _m, _s), n in made.items() if r == route), route
        assert total(samples, "werk_http_request_duration_seconds_bucket", route=route, le="+Inf") == count
        assert total(samples, "werk_http_request_duration_seconds_sum", route=route) > 0

    # chat counters per instance, from ChatStats (the one source)
    per_instance = host.service.chat_stats.per_instance()
    prompt = by_instance(samples, "werk_chat_prompt_tokens_total")
    completion = by_instance(samples, "werk_chat_completion_tokens_total")
    assert prompt == {k: c.prompt_tokens_total for k, c in per_instance.items()}
    assert completion == {k: c.completion_tokens_total for k, c in per_instance.items()}
    assert sum(prompt.values()) == usage["prompt_tokens"] + stream_usage["prompt_tokens"]
    assert sum(completion.values()) == usage["completion_tokens"] + stream_usage["completion_tokens"]
    assert sum(by_instance(samples, "werk_chat_requests_total").values()) == 2
    assert sum(by_instance(samples, "werk_chat_requests_active").values()) == 0
    assert types["werk_chat_requests_active"] == "gauge" and types["werk_chat_prompt_tokens"] == "counter"
    totals = host.service.chat_stats.read()
    assert totals.prompt_tokens_total == sum(prompt.values())

    # scrape-time reading: handoffs, states, instances, memory
    live_handoffs = host.service.handoffs.live_count()
    assert live_handoffs == 2
    assert total(samples, "werk_handoffs_live") == live_handoffs
    assert total(samples, "werk_states", tier="disk") == 2
    assert total(samples, "werk_state_bytes", tier="disk") == stored_bytes > 0
    assert {lab["tier"] for n, lab, _v in samples if n == "werk_states"} >= {"vram", "ram", "disk", "external"}
    current = {lab["instance"]: lab["state"] for n, lab, v in samples if n == "werk_instance_state" and v == 1}
    assert current == dict(host.service.metrics_reading().instances)
    assert "ready" in current.values()
    for inst in current:
        states = {lab["state"] for n, lab, _v in samples if n == "werk_instance_state" and lab["instance"] == inst}
        assert states == set(INSTANCE_STATES)
    for tier in ("host", "accelerator", "overall"):
        assert total(samples, "werk_memory_pressure", tier=tier) == 1  # exactly one level is current
    names = {n for n, _lab, _v in samples}
    for counter in MemoryCounters.model_fields:
        assert f"werk_memory_{counter}" in names or f"werk_memory_{counter}_total" in names, counter

    # no state id, handoff or key in any label value
    for name, labels, _value in samples:
        for text in labels.values():
            assert not any(secret in text for secret in secrets), (name, labels)
            assert "st_" not in text, (name, labels)


def test_chat_stats_keep_counts_per_instance_and_sum_them() -> None:
    stats = ChatStats()
    stats.add(requests_total=1, prompt_tokens_total=3)
    stats.add(instance="a", requests_total=2, prompt_tokens_total=5)
    with stats.request(instance="b"):
        assert stats.per_instance()["b"].requests_active == 1
    totals = stats.read()
    assert (totals.requests_total, totals.prompt_tokens_total, totals.requests_active) == (4, 8, 0)
    per = stats.per_instance()
    assert set(per) == {DEFAULT_INSTANCE, "a", "b"}
    assert per["a"].prompt_tokens_total == 5 and per[DEFAULT_INSTANCE].requests_total == 1
    with pytest.raises(KeyError):
        stats.add(no_such_counter=1)


def test_each_app_has_its_own_registry() -> None:
    chats = [ChatStats(), ChatStats()]
    registries = [HostMetrics(chat, None).registry for chat in chats]
    chats[0].add(instance="x", prompt_tokens_total=7)
    values: list[Any] = [
        registry.get_sample_value("werk_chat_prompt_tokens_total", {"instance": "x"}) for registry in registries
    ]
    assert values == [7.0, None]


def test_request_latency_buckets_are_inclusive_cumulative_and_created() -> None:
    metrics = HostMetrics(None, None)
    for elapsed in (0.005, 0.0051, 0.3, 301.0):  # on a bound, just past it, mid-range, past every bound
        metrics.requests.record("a", "/r", "GET", "200", elapsed)
    metrics.requests.record("a", "/r", "GET", "404", 0.001)
    samples = [
        (s.name, s.labels, s.value)
        for family in text_string_to_metric_families(generate_latest(metrics.registry).decode())
        for s in family.samples
    ]
    buckets = {labels["le"]: value for name, labels, value in samples if name.endswith("_bucket")}
    assert buckets["0.005"] == 2  # 0.001 and exactly 0.005
    assert buckets["0.01"] == 3
    assert buckets["0.25"] == 3 and buckets["0.5"] == 4
    assert buckets["300.0"] == 4 and buckets["+Inf"] == 5
    assert list(buckets.values()) == sorted(buckets.values())  # cumulative
    by_name = {(name, labels.get("status")): value for name, labels, value in samples}
    assert by_name["werk_http_requests_total", "200"] == 4 and by_name["werk_http_requests_total", "404"] == 1
    assert by_name["werk_http_request_duration_seconds_sum", None] == pytest.approx(301.3111)
    assert {"werk_http_requests_created", "werk_http_request_duration_seconds_created"} <= {n for n, _, _ in samples}

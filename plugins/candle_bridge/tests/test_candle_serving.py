"""The bridge behind a real werk serve on the generated tiny model: capability evidence before
and after loading, exact counts, concurrency, the OpenAI error contract."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from werk_candle_bridge import plugin
from werk_candle_bridge.adapter import CandleAdapter

from werk_host.plugin import ModelManifest
from werk_host.testing.hosts import LiveHost, serving
from werk_host.testing.markers import covers_hooks
from werk_host.testing.pytest_plugin import WerkServerFactory

pytestmark = pytest.mark.engine
KEY = "sk-werk-candle-serving-77"
MODEL = "tiny"
CEILING = 64
STATE_IDS = (
    "runtime.state.persistence",
    "runtime.state.restore",
    "runtime.state.tier.disk",
    "runtime.state.tier.ram",
    "runtime.pd.prefill",
    "runtime.pd.decode",
    "runtime.pd.handoff",
    "runtime.experts.residency",
)


@pytest.fixture(scope="module")
def live(tiny_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveHost]:
    home = tmp_path_factory.mktemp("candle-serving") / "home"
    manifest = ModelManifest.from_paths(MODEL, [tiny_gguf], backend="candle", params={"max_output_tokens": CEILING})
    with serving(home, plugin=plugin, model=manifest, api_keys=(KEY,)) as served:
        yield served


def _statuses(live: LiveHost) -> dict[str, dict[str, Any]]:
    status, doc = live.api.get("/werk/v1/capabilities")
    assert status == 200, doc
    return {c["id"]: c for c in doc["data"]}


def _adapter(live: LiveHost) -> CandleAdapter:
    adapter = live.host.fleet.adapter
    assert isinstance(adapter, CandleAdapter)
    return adapter


@covers_hooks("werk_capabilities", "werk_chat_limits", "werk_workers", "werk_deployment_plan")
def test_evidence_before_and_after_the_first_load(tiny_gguf: Path, werk_server: WerkServerFactory) -> None:
    # A model of its own (another manifest identity): nothing else in this process has loaded it.
    manifest = ModelManifest.from_paths(MODEL, [tiny_gguf], backend="candle", params={"max_output_tokens": CEILING - 1})
    live = werk_server(plugin, model=manifest)
    caps = _statuses(live)
    assert caps["runtime.model_residency"]["status"] == "unavailable"
    assert "not loaded" in caps["runtime.model_residency"]["detail"]
    assert caps["runtime.state.prefix_cache"]["status"] == "unsupported"
    assert caps["runtime.placement"]["status"] == "unsupported"
    for cap_id in STATE_IDS:
        assert caps[cap_id]["status"] == "unsupported", cap_id
    status, doc = live.api.get("/werk/v1/chat/limits", model=MODEL)
    assert status == 200 and doc["data"]["context_tokens"] == 4096  # the GGUF header, not loaded
    assert doc["data"]["max_output_tokens"] == CEILING - 1 and doc["data"]["max_concurrent_requests"] == 1
    assert _adapter(live).shared.loaded() is None
    status, doc = live.api.get("/werk/v1/observability")
    assert status == 200 and doc["data"]["workers"] == []
    identity = _adapter(live).identity()

    status, doc = live.api.post(
        "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    )
    assert status == 200, doc

    caps = _statuses(live)
    assert caps["runtime.model_residency"]["status"] == "supported"
    assert caps["runtime.placement"]["status"] == "supported"
    assert caps["runtime.state.prefix_cache"]["status"] == "unsupported"
    assert _adapter(live).identity() != identity
    status, doc = live.api.get("/werk/v1/observability")
    assert status == 200
    (worker,) = doc["data"]["workers"]
    assert worker["backend"] == "candle" and worker["context_per_request_tokens"] == 4096
    assert worker["prefix_cache_hit_rate"] is None


@covers_hooks("werk_count_tokens", "werk_chat_completion")
@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": "hello world"}],
        [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]},
            {"role": "assistant", "content": "three"},
            {"role": "user", "content": "four", "name": "me"},
        ],
        [{"role": "developer", "content": "ünïcödé ✓ <b>"}, {"role": "user", "content": "   "}],
    ],
    ids=["one", "conversation", "unicode"],
)
def test_counts_equal_usage(live: LiveHost, messages: list[dict[str, Any]]) -> None:
    status, doc = live.api.post("/werk/v1/chat/count_tokens", {"model": MODEL, "messages": messages})
    assert status == 200, doc
    counted = doc["data"]["input_tokens"]
    status, doc = live.api.post(
        "/v1/chat/completions", {"model": MODEL, "messages": messages, "max_tokens": 2, "temperature": 0}
    )
    assert status == 200, doc
    assert doc["usage"]["prompt_tokens"] == counted
    assert doc["usage"]["completion_tokens"] == 2 and doc["usage"]["total_tokens"] == counted + 2
    status, doc = live.api.post("/werk/v1/chat/admission", {"model": MODEL, "messages": messages, "max_tokens": 8})
    assert status == 200 and doc["data"]["input_tokens"] == counted and doc["data"]["token_count_method"] == "native"


def test_eight_concurrent_clients_all_succeed(live: LiveHost) -> None:
    client = openai.OpenAI(base_url=f"{live.url}/v1", api_key=KEY, max_retries=0, timeout=120)
    results: dict[int, tuple[str, int]] = {}
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            messages: Any = [{"role": "user", "content": f"client {i} says hello"}]
            if i % 2:
                chunks = list(
                    client.chat.completions.create(
                        model=MODEL,
                        messages=messages,
                        max_tokens=8,
                        stream=True,
                        stream_options={"include_usage": True},
                    )
                )
                usage = chunks[-1].usage
                assert usage is not None
                text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
                results[i] = (text, usage.completion_tokens)
            else:
                reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8)
                assert reply.usage is not None
                results[i] = (reply.choices[0].message.content or "", reply.usage.completion_tokens)
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not errors, errors
    assert sorted(results) == list(range(8))
    assert all(0 < tokens <= 8 for _, tokens in results.values())
    status, doc = live.api.get("/werk/v1/observability")
    assert status == 200 and doc["data"]["chat"]["requests_active"] == 0


@covers_hooks("werk_text_completion")
def test_completions_count_their_raw_prompt(live: LiveHost) -> None:
    status, doc = live.api.post("/v1/completions", {"model": MODEL, "prompt": "hello world", "max_tokens": 3})
    assert status == 200, doc
    assert doc["object"] == "text_completion" and doc["usage"]["prompt_tokens"] == 2  # two word pieces, no template
    assert doc["usage"]["completion_tokens"] == 3 and doc["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize(
    ("body", "count_status"),
    [
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}]}, 400),
        (
            {
                "messages": [{"role": "user", "content": "x"}],
                "tools": [{"type": "function", "function": {"name": "f"}}],
            },
            400,
        ),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": CEILING + 1}, 200),
        ({"messages": [{"role": "user", "content": "word " * 5000}], "max_tokens": 4}, 200),
    ],
    ids=["image", "tools", "ceiling", "context"],
)
def test_bad_chat_requests_are_typed_400s(live: LiveHost, body: dict[str, Any], count_status: int) -> None:
    status, doc = live.api.post("/v1/chat/completions", {"model": MODEL, **body})
    assert status == 400, doc
    assert doc["error"]["type"] == "invalid_request_error"
    status, doc = live.api.post("/werk/v1/chat/count_tokens", {"model": MODEL, **body})
    assert status == count_status, doc  # counting refuses what chat cannot render; limits are admission's

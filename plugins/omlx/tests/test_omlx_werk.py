"""The oMLX backend end to end: a real ``werk serve`` host, real MLX workers, every expert route over HTTP.

One host per module serves the tiny float32 MoE with ``WERK_OMLX_EXPERT_CACHE_MB=2`` (5 of its
32 experts of 384 KiB); tests that need a fresh host (nothing loaded yet) build their own.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import manifest_of
from werk_omlx import plugin
from werk_omlx.adapter import ENV_BUDGET, OmlxAdapter

from werk_host.testing.hosts import LiveHost, serving
from werk_host.testing.processes import gone

pytestmark = pytest.mark.mlx

KEY = "sk-werk-omlx-test-0123456789"
EXPERT_BYTES = 384 * 1024
MESSAGES = [{"role": "user", "content": "Which experts are hot today? Tell me about the cache."}]


def adapter_of(live: LiveHost) -> OmlxAdapter:
    adapter = live.host.fleet.adapter
    assert isinstance(adapter, OmlxAdapter)
    return adapter


def chat(live: LiveHost, **extra: Any) -> dict[str, Any]:
    body = {"model": "moe", "messages": MESSAGES, "max_tokens": 12, "temperature": 0, **extra}
    status, doc = live.api.post("/v1/chat/completions", body)
    assert status == 200, doc
    return doc


def experts_status(live: LiveHost) -> dict[str, Any]:
    status, doc = live.api.get("/werk/v1/capabilities")
    assert status == 200, doc
    return next(c for c in doc["data"] if c["id"] == "runtime.experts.residency")


def all_experts(live: LiveHost, **filters: Any) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    cursor = None
    while True:
        status, doc = live.api.get("/werk/v1/experts", allow_experimental=True, limit=10, cursor=cursor, **filters)
        assert status == 200, doc
        found += doc["data"]["experts"]
        cursor = doc["data"]["next_cursor"]
        if cursor is None:
            return found


def act(live: LiveHost, action: str, ids: list[str], **extra: Any) -> tuple[int, dict[str, Any]]:
    body = {"model_id": "moe", "expert_ids": ids, "action": action, "allow_experimental": True, **extra}
    return live.api.post("/werk/v1/experts/actions", body)


def by_id(experts: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {e["id"]: e for e in experts}


@pytest.fixture(scope="module")
def live(moe_f32: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveHost]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(ENV_BUDGET, "2")
        home = tmp_path_factory.mktemp("werk-omlx") / "home"
        with serving(home, plugin=plugin, plugin_name="omlx", model=manifest_of(moe_f32), api_keys=(KEY,)) as live:
            yield live


def test_expert_routes_never_load_a_model(moe_f32: Path, tmp_path: Path, budget_env: int) -> None:
    with serving(
        tmp_path / "home", plugin=plugin, plugin_name="omlx", model=manifest_of(moe_f32), api_keys=(KEY,)
    ) as fresh:
        report = experts_status(fresh)
        assert report["status"] == "unavailable" and "normal generation" in report["detail"]
        status, doc = fresh.api.get("/werk/v1/experts", allow_experimental=True)
        assert status == 503 and doc["error"]["code"] == "unavailable" and doc["error"]["retryable"], doc
        status, doc = act(fresh, "pin", ["L0E0"], dry_run=True)
        assert status == 503, doc
        status, doc = fresh.api.post("/werk/v1/chat/count_tokens", {"model": "moe", "messages": MESSAGES})
        assert status == 503, doc
        assert adapter_of(fresh).live_workers() == []  # nothing was started
        assert not (tmp_path / "home" / "backends" / "omlx" / "workers").exists() or not any(
            (tmp_path / "home" / "backends" / "omlx" / "workers").iterdir()
        )


def test_chat_is_stock_mlx_lm_output_streamed_or_not(live: LiveHost, moe_f32: Path) -> None:
    from mlx_lm import generate, load

    model, tokenizer = load(str(moe_f32))
    tokens = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True)
    expected = generate(model, tokenizer, tokens, max_tokens=12)

    doc = chat(live)
    assert doc["choices"][0]["message"]["content"] == expected
    assert doc["usage"]["prompt_tokens"] == len(tokens) and doc["usage"]["completion_tokens"] > 0

    from openai import OpenAI

    client = OpenAI(base_url=f"{live.url}/v1", api_key=KEY, max_retries=0)
    stream = client.chat.completions.create(
        model="moe",
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=12,
        temperature=0,
        stream=True,
    )
    pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert "".join(pieces) == expected and len([p for p in pieces if p]) > 1

    status, counted = live.api.post("/werk/v1/chat/count_tokens", {"model": "moe", "messages": MESSAGES})
    assert status == 200 and counted["data"]["input_tokens"] == len(tokens), counted
    assert doc["choices"][0]["finish_reason"] == "length" and doc["usage"]["completion_tokens"] == 12

    cut = next(i for i in range(3, len(expected)) if expected[i].strip())  # a stop string inside the answer
    stopped = chat(live, stop=[expected[cut : cut + 2]])
    assert stopped["choices"][0]["message"]["content"] == expected[: expected.find(expected[cut : cut + 2])]
    assert stopped["choices"][0]["finish_reason"] == "stop"

    raw = "The router picks two experts"
    status, doc = live.api.post("/v1/completions", {"prompt": raw, "max_tokens": 6, "temperature": 0})
    assert status == 200, doc
    assert doc["choices"][0]["text"] == generate(model, tokenizer, raw, max_tokens=6)


def test_listing_is_paged_experimental_and_truthful(live: LiveHost) -> None:
    chat(live)
    report = experts_status(live)
    assert report["status"] == "experimental" and "2 MiB" in report["detail"], report
    status, doc = live.api.get("/werk/v1/experts")
    assert status == 428 and doc["error"]["code"] == "experimental_opt_in_required", doc
    experts = all_experts(live)
    assert len(experts) == 32 and len(by_id(experts)) == 32
    for e in experts:
        assert set(e) == {"id", "model_id", "tier", "bytes", "hotness", "pinned", "last_used_unix_ms"}
        assert e["model_id"] == "moe" and e["bytes"] == EXPERT_BYTES and e["tier"] in ("ram", "external")
    resident = [e for e in experts if e["tier"] == "ram"]
    assert 0 < len(resident) <= 2 * 8  # the budget plus at most one layer's working set
    assert any(e["hotness"] > 0 and e["last_used_unix_ms"] for e in experts)
    assert {e["id"] for e in all_experts(live, tier="ram")} == {e["id"] for e in resident}
    status, doc = live.api.get("/werk/v1/experts", allow_experimental=True, model_id="not-this-one")
    assert status == 404, doc
    status, doc = live.api.get("/werk/v1/experts", allow_experimental=True, cursor="forged.cursor")
    assert status == 400, doc


def test_every_action_and_dry_run_through_http(live: LiveHost, moe_f32: Path) -> None:
    chat(live)
    experts = by_id(all_experts(live))
    cold = sorted(i for i, e in experts.items() if e["tier"] == "external")[:2]

    # prefetch: a dry run projects ram and changes nothing; the real one does it
    status, doc = act(live, "prefetch", cold, target_tier="ram", dry_run=True)
    assert status == 200 and doc["data"]["dry_run"] is True and doc["data"]["changed"] is True, doc
    assert {e["id"]: e["tier"] for e in doc["data"]["experts"] if e["id"] in cold} == dict.fromkeys(cold, "ram")
    assert {i: by_id(all_experts(live))[i]["tier"] for i in cold} == dict.fromkeys(cold, "external")
    status, doc = act(live, "prefetch", cold, target_tier="ram")
    assert status == 200 and doc["data"]["dry_run"] is False and doc["data"]["changed"] is True, doc
    assert {i: by_id(all_experts(live))[i]["tier"] for i in cold} == dict.fromkeys(cold, "ram")
    for tier, code in (("vram", 400), ("external", 400)):
        status, doc = act(live, "prefetch", cold, target_tier=tier)
        assert status == code and doc["error"]["code"] == "invalid_request", doc
    status, doc = act(live, "prefetch", cold)  # prefetch needs its target
    assert status == 400, doc

    # pin: dry run, then for real; pins survive the pressure of a chat
    status, doc = act(live, "pin", cold, dry_run=True)
    assert status == 200 and all(e["pinned"] for e in doc["data"]["experts"] if e["id"] in cold), doc
    assert not any(by_id(all_experts(live))[i]["pinned"] for i in cold)
    status, doc = act(live, "pin", cold, dry_run=False)
    assert status == 200 and doc["data"]["changed"] is True, doc
    chat(live, max_tokens=16)
    after = by_id(all_experts(live))
    assert all(after[i]["pinned"] and after[i]["tier"] == "ram" for i in cold)
    status, doc = act(live, "pin", cold, dry_run=False)  # already pinned
    assert status == 200 and doc["data"]["changed"] is False, doc

    # capacity applies to pins; a pinned expert cannot be evicted
    others = sorted(i for i in after if i not in cold)[:4]
    status, doc = act(live, "pin", others, dry_run=True)
    assert status == 429 and doc["error"]["code"] == "resource_exhausted", doc
    status, doc = act(live, "evict", cold[:1], dry_run=False)
    assert status == 409 and doc["error"]["code"] == "conflict", doc

    # unpin, then evict: the cached copy goes, the checkpoint stays
    weights = (moe_f32 / "model.safetensors").stat()
    status, doc = act(live, "unpin", cold, dry_run=False)
    assert status == 200 and not any(e["pinned"] for e in doc["data"]["experts"]), doc
    status, doc = act(live, "evict", cold, dry_run=True)
    assert status == 200 and all(e["tier"] == "external" for e in doc["data"]["experts"]), doc
    assert all(by_id(all_experts(live))[i]["tier"] == "ram" for i in cold)
    status, doc = act(live, "evict", cold, dry_run=False)
    assert status == 200 and doc["data"]["changed"] is True, doc
    assert all(by_id(all_experts(live))[i]["tier"] == "external" for i in cold)
    assert (moe_f32 / "model.safetensors").stat().st_size == weights.st_size
    chat(live)  # the model still serves from the checkpoint

    # bad requests: typed, nothing consumed
    for body, code in (
        ({"expert_ids": ["L99E0"], "action": "pin"}, 404),
        ({"expert_ids": ["not-an-expert"], "action": "pin"}, 404),
        ({"expert_ids": ["L0E0"], "action": "pin", "model_id": "other"}, 404),
        ({"expert_ids": [f"L0E{i}" for i in range(257)], "action": "pin"}, 400),
        ({"expert_ids": ["L0E0", "L0E0"], "action": "pin"}, 400),
        ({"expert_ids": ["L0E0"], "action": "pin", "target_tier": "ram"}, 400),
        ({"expert_ids": [], "action": "evict"}, 400),
    ):
        status, doc = live.api.post(
            "/werk/v1/experts/actions", {"model_id": "moe", "allow_experimental": True, "dry_run": False, **body}
        )
        assert status == code, (body, doc)
    status, doc = live.api.post(
        "/werk/v1/experts/actions", {"model_id": "moe", "expert_ids": ["L0E0"], "action": "pin", "dry_run": True}
    )
    assert status == 428, doc


def test_werk_runtime_experts_cli(live: LiveHost) -> None:
    chat(live)
    env = {**os.environ, "WERK_API_KEY": KEY}
    base = [sys.executable, "-m", "werk_host.cli", "runtime", "experts"]

    def run(*args: str) -> dict[str, Any]:
        done = subprocess.run([*base, *args, "--server", live.url, "--json"], env=env, capture_output=True, timeout=120)
        assert done.returncode == 0, done.stderr.decode()
        result: dict[str, Any] = json.loads(done.stdout)
        return result

    listed = run("list", "--allow-experimental", "--tier", "external", "--limit", "3")
    assert len(listed["experts"]) == 3 and listed["next_cursor"]
    target = listed["experts"][0]["id"]
    preview = run(
        "action", "prefetch", "--model-id", "moe", "--expert-id", target, "--target-tier", "ram", "--allow-experimental"
    )
    assert preview["dry_run"] is True and by_id(preview["experts"])[target]["tier"] == "ram"
    assert by_id(all_experts(live))[target]["tier"] == "external"
    done = run(
        "action", "prefetch", "--model-id", "moe", "--expert-id", target, "--target-tier", "ram",
        "--allow-experimental", "--execute",
    )  # fmt: skip
    assert done["dry_run"] is False and by_id(all_experts(live))[target]["tier"] == "ram"
    refused = subprocess.run(
        [*base, "list", "--server", live.url], env=env, capture_output=True, timeout=120
    )  # no opt-in: the server's 428
    assert refused.returncode != 0 and b"experimental_opt_in_required" in refused.stderr


def test_each_budget_has_its_worker_and_experts_follow_the_most_recent(live: LiveHost) -> None:
    chat(live)
    assert "2 MiB" in experts_status(live)["detail"]
    chat(live, werk={"omlx": {"expert_cache_mb": 3}})
    assert "3 MiB" in experts_status(live)["detail"]
    adapter = adapter_of(live)
    assert sorted(w.spec.budget_bytes or 0 for w in adapter.live_workers()) == [2 << 20, 3 << 20]
    assert len([e for e in all_experts(live) if e["tier"] == "ram"]) > 0
    chat(live)  # the environment's budget again
    assert "2 MiB" in experts_status(live)["detail"]
    status, doc = live.api.post(
        "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 2, "werk": {"omlx": {"ngram_cache_mb": 64}}}
    )
    assert status == 400, doc
    doc = chat(live, werk={"omlx": {"thinking": False, "ngram_cache_mb": "auto"}})
    assert doc["choices"][0]["message"]["content"]


def test_a_dead_worker_is_reported_and_replaced(live: LiveHost) -> None:
    chat(live)
    adapter = adapter_of(live)
    before = adapter.identity()
    for worker in adapter.live_workers():
        assert worker.pid is not None
        os.killpg(worker.pid, signal.SIGKILL)
        assert gone(worker.pid)
        deadline = time.monotonic() + 10  # the leader is a zombie before its other threads are gone
        while worker.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not worker.alive()
    assert experts_status(live)["status"] == "unavailable"
    status, doc = live.api.get("/werk/v1/experts", allow_experimental=True)
    assert status == 503, doc
    chat(live)
    assert adapter.identity() != before
    assert experts_status(live)["status"] == "experimental"

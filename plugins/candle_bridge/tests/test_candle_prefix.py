"""``runtime.state.prefix_cache``: off by default (the seed's "no cross-request KV reuse"); with
``--persistence`` the engine's prefix cache is on and claimed only after a hit was observed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from werk_candle_bridge import plugin

from werk_host.plugin import ModelManifest, PersistenceDefaults, ReusePolicy
from werk_host.testing.hosts import LiveHost
from werk_host.testing.pytest_plugin import WerkServerFactory

pytestmark = pytest.mark.engine
FIRST = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a fruit."}]


def _prefix_cache(live: LiveHost) -> dict[str, Any]:
    status, doc = live.api.get("/werk/v1/capabilities")
    assert status == 200, doc
    report: dict[str, Any] = next(c for c in doc["data"] if c["id"] == "runtime.state.prefix_cache")
    return report


def _two_turns(live: LiveHost) -> tuple[dict[str, Any], dict[str, Any]]:
    """A first turn, then a second that extends its prompt and answer (the reused pattern)."""
    status, first = live.api.post("/v1/chat/completions", {"messages": FIRST, "max_tokens": 5, "temperature": 0})
    assert status == 200, first
    answer = {"role": "assistant", "content": first["choices"][0]["message"]["content"]}
    messages = [*FIRST, answer, {"role": "user", "content": "Another one."}]
    status, second = live.api.post("/v1/chat/completions", {"messages": messages, "max_tokens": 2, "temperature": 0})
    assert status == 200, second
    return first["usage"], second["usage"]


def _serve(werk_server: WerkServerFactory, model: Path, **options: Any) -> LiveHost:
    return werk_server(plugin, model=ModelManifest.from_paths("tiny", [model], backend="candle"), **options)


def test_with_persistence_a_hit_is_observed_then_claimed(tiny_gguf: Path, werk_server: WerkServerFactory) -> None:
    live = _serve(werk_server, tiny_gguf, persistence=PersistenceDefaults())
    before = _prefix_cache(live)
    assert before["status"] == "unavailable" and "not loaded" in before["detail"]
    first, second = _two_turns(live)  # the first request loads the model and runs the check
    report = _prefix_cache(live)
    assert report["status"] == "supported" and report["operations"] == ["automatic_reuse"]
    assert second["prompt_tokens_details"]["cached_tokens"] >= first["prompt_tokens"]
    status, doc = live.api.get("/werk/v1/observability")
    assert status == 200
    assert doc["data"]["workers"][0]["prefix_cache_hit_rate"] > 0
    status, doc = live.api.get("/werk/v1/deployments")
    assert "prefix_cache_n=16" in doc["data"]["plans"][0]["plan"]["arguments"]


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"persistence": PersistenceDefaults(reuse=ReusePolicy.DISABLED)},
        {"persistence": PersistenceDefaults(), "backend_options": {"prefix_cache_n": 0}},
    ],
    ids=["default", "reuse-disabled", "option-off"],
)
def test_without_reuse_nothing_is_cached_or_claimed(
    tiny_gguf: Path, werk_server: WerkServerFactory, options: dict[str, Any]
) -> None:
    live = _serve(werk_server, tiny_gguf, **options)
    _, second = _two_turns(live)
    assert "prompt_tokens_details" not in second  # the engine cached nothing
    report = _prefix_cache(live)
    assert report["status"] == "unsupported" and "prefix_cache_n=0" in report["detail"]

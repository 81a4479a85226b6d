"""The Werk-owned reasoning tier resolver against the protocol reference's example."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import falcon.testing
import pytest

from werk_host.plugin import hookimpl
from werk_host.protocol import ChatRequest, ReasoningTierId
from werk_host.seam import InferenceResponse, JsonObject
from werk_host.service.reasoning import budget_profile
from werk_host.testing.hosts import make_host
from werk_host.testing.reference import PLUGIN_NAME, MemoryAdapter, MemoryBackendPlugin
from werk_host.testing.reference_base import count_chat_tokens


def test_resolver_reproduces_the_seed_example() -> None:
    profile = budget_profile(
        model="my-model",
        backend="llama.cpp",
        context_tokens=32768,
        output_tokens=2048,
        launch_budget=2048,
        thinking_enabled=True,
    )
    assert profile.default_tier is ReasoningTierId.MEDIUM and profile.default_adjusted_to_limits is True
    assert profile.limits is not None
    assert (profile.limits.output_tokens, profile.limits.answer_reserve_tokens, profile.limits.reasoning_tokens) == (
        2048,
        512,
        1536,
    )
    assert [(t.id.value, t.available, t.reasoning_tokens, t.minimum_output_tokens) for t in profile.tiers] == [
        ("none", True, 0, 1),
        ("low", True, 512, 1024),
        ("medium", True, 1024, 1536),
        ("high", False, 2048, 2560),
        ("max", False, 4096, 4608),
        ("ultra", False, 8192, 8704),
    ]


def test_named_launch_effort_is_kept_and_disabled_thinking_stays_none() -> None:
    kept = budget_profile(
        model="m",
        backend="llama.cpp",
        context_tokens=32768,
        output_tokens=8192,
        launch_budget=-1,
        thinking_enabled=True,
        launch_effort=ReasoningTierId.LOW,
    )
    assert (kept.default_tier, kept.default_adjusted_to_limits) == (ReasoningTierId.LOW, False)
    reduced = budget_profile(
        model="m",
        backend="llama.cpp",
        context_tokens=32768,
        output_tokens=1024,
        launch_budget=-1,
        thinking_enabled=True,
        launch_effort=ReasoningTierId.HIGH,
    )
    assert (reduced.default_tier, reduced.default_adjusted_to_limits) == (ReasoningTierId.LOW, True)
    off = budget_profile(
        model="m",
        backend="llama.cpp",
        context_tokens=32768,
        output_tokens=8192,
        launch_budget=-1,
        thinking_enabled=False,
    )
    assert off.default_tier is ReasoningTierId.NONE


def test_output_is_limited_to_context_minus_the_reserve() -> None:
    profile = budget_profile(
        model="m", backend="llama.cpp", context_tokens=1536, output_tokens=8192, launch_budget=-1, thinking_enabled=True
    )
    assert profile.limits is not None and profile.limits.output_tokens == 1024
    assert profile.limits.reasoning_tokens == 512 and profile.default_tier is ReasoningTierId.LOW


# -- resolved once by the host: every hook that takes a chat request gets the resolution -----

RESOLVED_KEY = "sk-werk-reasoning-once-0042"


class _Recording(MemoryAdapter):
    """The reference adapter, keeping what its counting and chat hooks received."""

    counted: list[ChatRequest]
    bodies: list[JsonObject]

    @hookimpl(specname="werk_count_tokens")
    def count_tokens(self, request: ChatRequest) -> int:
        self.__dict__.setdefault("counted", []).append(request)
        return count_chat_tokens(request)

    @hookimpl(specname="werk_chat_completion")
    def chat_completion(self, request: JsonObject) -> InferenceResponse:
        self.__dict__.setdefault("bodies", []).append(request)
        return MemoryAdapter.chat_completion(self, request)


class _RecordingPlugin(MemoryBackendPlugin):
    adapter_class = _Recording


@pytest.fixture
def recording(tmp_path: Path) -> Iterator[tuple[falcon.testing.TestClient, _Recording]]:
    plugin = _RecordingPlugin()
    host = make_host(tmp_path / "home", plugin=plugin, plugin_name=PLUGIN_NAME, api_keys=(RESOLVED_KEY,))
    try:
        client = falcon.testing.TestClient(host.app, headers={"Authorization": f"Bearer {RESOLVED_KEY}"})
        assert client.simulate_get("/werk/v1/chat/limits").status_code == 200
        adapter = host.fleet.adapter
        assert isinstance(adapter, _Recording)
        yield client, adapter
    finally:
        host.close()


def _chat(tier: str, **extra: Any) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": "one two"}],
        "max_tokens": 8,
        "werk": {"reasoning": {"tier": tier, **extra}},
    }


def test_counting_gets_the_resolved_request_as_chat_gets_the_resolved_body(
    recording: tuple[falcon.testing.TestClient, _Recording],
) -> None:
    client, adapter = recording
    counted = client.simulate_post("/werk/v1/chat/count_tokens", json=_chat("none"))
    assert counted.status_code == 200, counted.text
    (request,) = adapter.counted
    assert request.werk is not None and request.werk.reasoning is not None
    assert (request.werk.reasoning.tier, request.werk.reasoning.resolved_budget_tokens) == ("none", 0)
    resolved = request.model_dump(mode="json", exclude_none=True)["werk"]["reasoning"]

    chat = client.simulate_post("/v1/chat/completions", json=_chat("none"))
    assert chat.status_code == 200, chat.text
    (body,) = adapter.bodies
    assert body["werk"] == {"reasoning": resolved}  # the one resolution, handed to both hooks

    default = client.simulate_post("/werk/v1/chat/admission", json=_chat("default"))
    assert default.status_code == 200, default.text
    last = adapter.counted[-1].werk
    assert last is not None and last.reasoning is not None
    assert (last.reasoning.tier, last.reasoning.resolved_budget_tokens) == ("none", 0)  # the one that fits


def test_a_client_cannot_send_the_resolution(recording: tuple[falcon.testing.TestClient, _Recording]) -> None:
    client, adapter = recording
    for path in ("/werk/v1/chat/count_tokens", "/v1/chat/completions"):
        refused = client.simulate_post(path, json=_chat("none", resolved_budget_tokens=99))
        assert refused.status_code == 400, refused.text
        assert "resolved_budget_tokens" in refused.text
    assert not adapter.__dict__.get("counted") and not adapter.__dict__.get("bodies")

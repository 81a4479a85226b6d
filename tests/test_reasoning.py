"""The Werk-owned reasoning tier resolver against the protocol reference's example."""

from __future__ import annotations

from werk_host.protocol import ReasoningTierId
from werk_host.service.reasoning import budget_profile


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

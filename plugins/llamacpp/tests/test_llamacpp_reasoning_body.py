"""What llama-server is sent for a reasoning tier the host resolved (werk_llamacpp.reasoning).

The host resolves ``werk.reasoning.tier`` once per request and hands ``werk_count_tokens`` the
request resolved as it hands ``werk_chat_completion`` the body (docs/plugin-kit.md). The plugin
turns ``resolved_budget_tokens`` into llama-server's thinking switch and budget, the same for
counting as for the chat, and never resolves a tier itself: no server is needed here.
"""

from __future__ import annotations

from typing import Any

import pytest
from werk_llamacpp.reasoning import counted_request, forwarded_chat

from werk_host.plugin import ChatRequest, ErrorCode, WerkError

HELLO = [{"role": "user", "content": "hello there"}]


def _body(reasoning: dict[str, Any], **extra: Any) -> dict[str, Any]:
    # 64 output tokens: no tier but "none" would fit a profile, so a second resolution would refuse "low"
    return {"model": "tiny", "messages": HELLO, "max_tokens": 64, "werk": {"reasoning": reasoning}, **extra}


def _sent(request: ChatRequest) -> dict[str, Any]:
    return request.model_dump(mode="json", exclude_none=True)


@pytest.mark.parametrize(("budget", "thinking"), [(512, True), (0, False)])
def test_the_count_renders_the_budget_the_host_resolved(budget: int, thinking: bool) -> None:
    body = _body({"tier": "low" if budget else "none", "resolved_budget_tokens": budget})
    counted = _sent(counted_request(ChatRequest.model_validate(body)))
    assert "werk" not in counted
    assert counted["chat_template_kwargs"] == {"enable_thinking": thinking}
    assert counted["reasoning_budget_tokens"] == budget
    chat = forwarded_chat(body)
    assert {k: counted[k] for k in chat} == chat  # the chat sends what was counted


def test_an_unresolved_tier_is_not_resolved_by_the_plugin() -> None:
    counted = _sent(counted_request(ChatRequest.model_validate(_body({"tier": "low"}))))
    assert "werk" not in counted and "chat_template_kwargs" not in counted and "reasoning_budget_tokens" not in counted


def test_a_request_without_werk_is_counted_as_it_is() -> None:
    request = ChatRequest.model_validate({"model": "tiny", "messages": HELLO})
    assert counted_request(request) is request


def test_a_resolved_tier_with_the_native_thinking_switch_is_refused() -> None:
    body = _body({"tier": "low", "resolved_budget_tokens": 512}, chat_template_kwargs={"enable_thinking": False})
    with pytest.raises(WerkError) as err:
        counted_request(ChatRequest.model_validate(body))
    assert err.value.code is ErrorCode.INVALID_REQUEST
    assert err.value.details["openai_code"] == "invalid_reasoning_tier"

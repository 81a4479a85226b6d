"""The fit bound's request shapes and arithmetic (``werk_host.service.admission``).

Which requests the calibrated bound may speak for is what keeps it sound: anything that can
reach the chat template other than message text in the calibrated roles must be counted
exactly. The bound's behaviour against real tokenizers and templates is tested with a real
llama-server in ``plugins/llamacpp/tests/test_llamacpp_admission.py``.
"""

from __future__ import annotations

from typing import Any

import pytest

from werk_host.protocol import ChatRequest
from werk_host.protocol.chat import ChatRole
from werk_host.service.admission import (
    SLACK_FIXED,
    SLACK_PER_MESSAGE,
    PlainShape,
    TemplateEvidence,
    plain_shape,
)


def _request(*roles: str, **extra: Any) -> ChatRequest:
    messages = [{"role": role, "content": f"{role} text"} for role in roles]
    return ChatRequest.model_validate({"messages": messages, **extra})


@pytest.mark.parametrize(
    "roles",
    [
        ("user",),
        ("system", "user"),
        ("user", "assistant"),
        ("user", "assistant", "user"),
        ("system", "user", "assistant", "user", "assistant"),
    ],
)
def test_calibrated_conversations_have_a_shape(roles: tuple[str, ...]) -> None:
    shape = plain_shape(_request(*roles, temperature=0, seed=1, max_tokens=9, stream=True, ignore_eos=True))
    assert shape is not None
    assert shape.system_led is (roles[0] == "system")
    lead = 2 if shape.system_led else 1
    assert shape.tail_roles == tuple(ChatRole(r) for r in roles[lead:])
    assert shape.content_bytes == tuple(len(f"{r} text") for r in roles)


@pytest.mark.parametrize(
    "roles",
    [("system",), ("assistant", "user"), ("user", "user"), ("system", "system", "user"), ("developer", "user")],
)
def test_other_role_sequences_are_counted(roles: tuple[str, ...]) -> None:
    assert plain_shape(_request(*roles)) is None


@pytest.mark.parametrize(
    "extra",
    [
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
        {"reasoning_effort": "low"},
        {"chat_template_kwargs": {"enable_thinking": False}},
        {"response_format": {"type": "json_object"}},
        {"werk": {"reasoning": {"tier": "default"}}},
    ],
)
def test_options_that_reach_the_template_are_counted(extra: dict[str, Any]) -> None:
    assert plain_shape(_request("user", **extra)) is None


@pytest.mark.parametrize(
    "message",
    [
        {"role": "user", "content": [{"type": "text", "text": "parts"}]},
        {"role": "user", "content": "named", "name": "alice"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        },
    ],
)
def test_messages_beyond_plain_text_are_counted(message: dict[str, Any]) -> None:
    messages = [{"role": "user", "content": "q"}, message] if message["role"] == "assistant" else [message]
    assert plain_shape(ChatRequest.model_validate({"messages": messages})) is None


def test_the_bound_adds_framing_content_bytes_and_slack() -> None:
    evidence = TemplateEvidence(lead={False: 11}, step={ChatRole.USER: 13, ChatRole.ASSISTANT: 1})
    request = ChatRequest.model_validate(
        {
            "messages": [
                {"role": "user", "content": "é漢"},  # 2 + 3 bytes
                {"role": "assistant", "content": "ok"},
                {"role": "user", "content": "🙂"},  # 4 bytes
            ]
        }
    )
    shape = plain_shape(request)
    assert shape == PlainShape(False, (ChatRole.ASSISTANT, ChatRole.USER), (5, 2, 4))
    assert evidence.bound(shape) == 11 + 1 + 13 + (5 + 2 + 4) + 3 * SLACK_PER_MESSAGE + SLACK_FIXED
    # a system-led request needs system-led evidence
    system_led = plain_shape(_request("system", "user"))
    assert system_led is not None and evidence.bound(system_led) is None

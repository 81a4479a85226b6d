"""The text nodes against a real ``werk serve`` on llama.cpp with SmolLM2-135M-Instruct:
a chat, a prefill → decode chain whose handoff appears in no ``STRING`` output, saved prompt,
log or repr, a spent handoff refused, states, experts and errors as node errors."""

from __future__ import annotations

import json
import logging
from typing import Any

import openai
import pytest
from comfyui_host import ExecutionError, Prompt, execute, validate

from werk_host.testing.hosts import ServeProcess

pytestmark = pytest.mark.llamaserver


def _connection(server: ServeProcess, key_env: str) -> dict[str, Any]:
    return {
        "class_type": "WerkConnection",
        "inputs": {
            "base_url": server.url,
            "api_key_source": "environment",
            "api_key_env": key_env,
            "api_key_file": "",
            "timeout_s": 300.0,
        },
    }


def _run(prompt: Prompt, nodes: dict[str, type]) -> dict[str, tuple[Any, ...]]:
    assert validate(prompt, nodes) == {}
    return execute(prompt, nodes)


def test_a_chat_node_answers_as_the_openai_sdk_does(
    nodes: dict[str, type], text_server: ServeProcess, key_env: str, key: str
) -> None:
    chat = {"prompt": "Name a colour.", "system": "Answer in one word.", "max_tokens": 12, "temperature": 0.0}
    chat |= {"seed": 7, "reasoning_tier": "unset", "model": "smollm2"}
    prompt = {
        "1": _connection(text_server, key_env),
        "2": {"class_type": "WerkChat", "inputs": {**chat, "connection": ["1", 0]}},
    }
    text, _reasoning = _run(prompt, nodes)["2"]
    sdk = openai.OpenAI(base_url=text_server.url + "/v1", api_key=key)
    expected = sdk.chat.completions.create(
        model="smollm2",
        messages=[{"role": "system", "content": chat["system"]}, {"role": "user", "content": chat["prompt"]}],
        max_tokens=12,
        temperature=0.0,
        seed=7,
    )
    assert text and text == expected.choices[0].message.content


def test_a_backend_option_nobody_owns_is_a_node_error(
    nodes: dict[str, type], text_server: ServeProcess, key_env: str
) -> None:
    chat = {"prompt": "hi", "max_tokens": 4, "temperature": 0.0, "seed": 0, "reasoning_tier": "unset"}
    chat |= {"backend_options": '{"nosuchbackend": {"x": 1}}'}
    prompt = {
        "1": _connection(text_server, key_env),
        "2": {"class_type": "WerkChat", "inputs": {**chat, "connection": ["1", 0]}},
    }
    with pytest.raises(ExecutionError, match=r"Werk invalid_request: .*\nFix: "):
        _run(prompt, nodes)


def _chain(server: ServeProcess, key_env: str, mode: str = "auto") -> Prompt:
    prefill = {"model": "smollm2", "text": "Werk keeps this prefix. The sky is", "mode": mode, "pin": False}
    prefill |= {"allow_experimental": True}  # llama.cpp's prefill is experimental (its slot probe)
    decode = {"max_tokens": 8, "temperature": 0.0, "seed": 0, "allow_experimental": True}
    return {
        "1": _connection(server, key_env),
        "2": {"class_type": "WerkPrefill", "inputs": {**prefill, "connection": ["1", 0]}},
        "3": {"class_type": "WerkDecode", "inputs": {**decode, "handoff": ["2", 0]}},
    }


def test_prefill_then_decode_keeps_the_handoff_off_every_output(
    nodes: dict[str, type],
    text_server: ServeProcess,
    key_env: str,
    key: str,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.DEBUG)
    prompt = _chain(text_server, key_env)
    secrets: list[str] = []

    def peek(node_id: str, result: tuple[Any, ...]) -> None:
        if node_id == "2":  # the test's own look at the secret, before decode spends it
            secrets.append(result[0]._secret.get_secret_value())

    assert validate(prompt, nodes) == {}
    outputs = execute(prompt, nodes, after=peek)
    handoff, state_id, prompt_tokens = outputs["2"]
    assert type(handoff).__name__ == "StateHandoff" and handoff.spent and prompt_tokens > 0
    text, following = outputs["3"]
    assert isinstance(text, str) and text.strip()
    (secret,) = secrets
    assert len(secret) >= 16
    strings = [v for values in outputs.values() for v in values if isinstance(v, str)]
    history = json.dumps({"prompt": prompt, "outputs": {k: [repr(v) for v in vs] for k, vs in outputs.items()}})
    logs = caplog.text + "".join(capfd.readouterr())
    assert "POST /werk/v1/decode -> 200" in caplog.text  # the client's log was captured
    for place in (*strings, history, logs, repr(handoff), repr(following)):
        assert secret not in place and key not in place
    assert state_id.startswith("st_") and following is None  # llama.cpp's decode returns no next handoff


def test_a_spent_handoff_is_refused_here_and_a_replayed_one_by_the_server(
    nodes: dict[str, type], text_server: ServeProcess, key_env: str
) -> None:
    prompt = _chain(text_server, key_env)
    outputs = _run(prompt, nodes)
    spent = outputs["2"][0]
    decode = nodes["WerkDecode"]()
    inputs = {k: v for k, v in prompt["3"]["inputs"].items() if k != "handoff"}
    with pytest.raises(Exception, match="expired_handoff.*already decoded"):
        decode.run(spent, **inputs)  # type: ignore[attr-defined]
    # The same secret presented again (a copy the node would never make) is the server's 410.
    fresh = execute({k: v for k, v in prompt.items() if k != "3"}, nodes)["2"][0]
    secret = fresh.take()
    handoff_type = type(fresh)  # the class of the package ComfyUI loaded
    first = handoff_type(fresh.connection, secret, fresh.state_id, fresh.prompt_tokens)
    again = handoff_type(fresh.connection, secret, fresh.state_id, fresh.prompt_tokens)
    decode.run(first, **inputs)  # type: ignore[attr-defined]
    with pytest.raises(Exception, match=r"Werk expired_handoff: .*\nFix: .*Werk Prefill again"):
        decode.run(again, **inputs)  # type: ignore[attr-defined]


def test_a_wrong_key_is_an_unauthorized_node_error_that_names_no_key(
    nodes: dict[str, type], text_server: ServeProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WERK_COMFYUI_WRONG_KEY", "sk-wrong-0123456789")
    prompt = _chain(text_server, "WERK_COMFYUI_WRONG_KEY")
    with pytest.raises(ExecutionError) as caught:
        _run(prompt, nodes)
    assert caught.value.node_id == "2" and "Werk unauthorized" in str(caught.value.error)
    assert "Fix:" in str(caught.value.error) and "sk-wrong" not in str(caught.value.error)


def test_states_and_a_dry_run_pin_show_the_prefilled_state(
    nodes: dict[str, type], text_server: ServeProcess, key_env: str
) -> None:
    prompt = _chain(text_server, key_env, mode="disk")
    del prompt["3"]
    prompt["4"] = {
        "class_type": "WerkStates",
        "inputs": {"connection": ["1", 0], "tier": "any", "limit": 100, "model": "smollm2"},
    }
    outputs = _run(prompt, nodes)
    state_id = outputs["2"][1]
    listed = outputs["4"][0]
    assert state_id and state_id in listed
    action = {"connection": ["1", 0], "state_id": state_id, "action": "pin", "target_tier": "none"}
    action |= {"dry_run": True, "allow_experimental": False}
    pinned = _run({"1": prompt["1"], "5": {"class_type": "WerkStateAction", "inputs": action}}, nodes)["5"][0]
    assert json.loads(pinned)["dry_run"] is True


def test_an_opted_in_expert_node_gets_the_server_s_answer_as_a_node_error(
    nodes: dict[str, type], text_server: ServeProcess, key_env: str
) -> None:
    experts = {"connection": ["1", 0], "model": "smollm2", "tier": "any", "limit": 10, "allow_experimental": True}
    prompt = {"1": _connection(text_server, key_env), "2": {"class_type": "WerkExperts", "inputs": experts}}
    with pytest.raises(ExecutionError, match=r"Werk unsupported: .*\nFix: "):
        _run(prompt, nodes)

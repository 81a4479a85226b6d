"""The nodes' interface as ComfyUI reads it, and the strict validator, without a server."""

from __future__ import annotations

import contextlib
import copy
import json
import pickle
import socket
import sys
import threading
from pathlib import Path

import pytest
import werk_comfyui
from comfyui_host import ExecutionError, execute, validate
from pydantic import SecretStr
from werk_comfyui.connection import Connection, StateHandoff

from werk_host.client import WerkProtocolClient

SECRET = "hoff-SECRET-0123456789abcdef"


def test_comfyui_loads_every_node_with_its_interface(nodes: dict[str, type]) -> None:
    assert set(nodes) == set(werk_comfyui.NODE_CLASS_MAPPINGS) == set(werk_comfyui.NODE_DISPLAY_NAME_MAPPINGS)
    for name, cls in nodes.items():
        declared = cls.INPUT_TYPES()  # type: ignore[attr-defined]
        assert set(declared) <= {"required", "optional", "hidden"}, name
        assert isinstance(cls.RETURN_TYPES, tuple) and callable(getattr(cls, cls.FUNCTION)), name  # type: ignore[attr-defined]
        assert cls.CATEGORY == "Werk" and callable(cls.VALIDATE_INPUTS), name  # type: ignore[attr-defined]


def test_the_handoff_travels_only_on_its_own_socket_type(nodes: dict[str, type]) -> None:
    assert nodes["WerkPrefill"].RETURN_TYPES[0] == "WERK_STATE_HANDOFF"  # type: ignore[attr-defined]
    assert nodes["WerkDecode"].INPUT_TYPES()["required"]["handoff"] == ("WERK_STATE_HANDOFF",)  # type: ignore[attr-defined]
    for name, cls in nodes.items():
        for section in cls.INPUT_TYPES().values():  # type: ignore[attr-defined]
            assert not any("handoff" in n and spec[0] != "WERK_STATE_HANDOFF" for n, spec in section.items()), name
            assert "api_key" not in section, f"{name}: a key must never be a widget value"


def test_a_handoff_shows_no_secret_and_cannot_be_copied_or_reused() -> None:
    connection = Connection("http://127.0.0.1:9", WerkProtocolClient("http://127.0.0.1:9", "sk-x"))
    handoff = StateHandoff(connection, SecretStr(SECRET), "st_1", 5)
    assert SECRET not in repr(handoff) and SECRET not in str(handoff) and "sk-x" not in repr(connection)
    for attempt in (pickle.dumps, copy.copy, copy.deepcopy, json.dumps):
        with pytest.raises(TypeError):
            attempt(handoff)
    assert handoff.take().get_secret_value() == SECRET
    with pytest.raises(Exception, match="expired_handoff"):
        handoff.take()


def _connection(**changes: object) -> dict[str, object]:
    inputs: dict[str, object] = {
        "base_url": "http://127.0.0.1:11434",
        "api_key_source": "none",
        "api_key_env": "WERK_API_KEY",
        "api_key_file": "",
        "timeout_s": 30.0,
    }
    return {**inputs, **changes}


CHAT = {"prompt": "hi", "max_tokens": 8, "temperature": 0.0, "seed": 1, "reasoning_tier": "unset"}


@pytest.mark.parametrize(
    ("node", "inputs", "words"),
    [
        ("WerkConnection", _connection(base_url="https://example.test"), "base"),
        ("WerkChat", {**CHAT, "backend_options": "{not json"}, "backend_options"),
        ("WerkChat", {**CHAT, "backend_options": '{"reasoning": {}}'}, "reasoning_tier"),
        ("WerkChat", {**CHAT, "backend_options": '{"Bad Name": {}}'}, "backend_options"),
        ("WerkChat", {**CHAT, "prompt": "   "}, "prompt"),
        ("WerkPrefill", {"model": "", "text": "x", "mode": "auto", "pin": False, "allow_experimental": False}, "model"),
        ("WerkDecode", {"max_tokens": 0, "temperature": 0.0, "seed": 0, "allow_experimental": False}, "max_tokens"),
        (
            "WerkStateAction",
            {
                "state_id": "st_1",
                "action": "promote",
                "target_tier": "none",
                "dry_run": True,
                "allow_experimental": False,
            },
            "target_tier",
        ),
        ("WerkExperts", {"model": "m", "tier": "any", "limit": 10, "allow_experimental": False}, "allow_experimental"),
        (
            "WerkImage",
            {
                "prompt": "a",
                "negative_prompt": "",
                "width": 2048,
                "height": 2048 + 8,
                "steps": 1,
                "guidance_scale": 1.0,
                "seed": 0,
                "batch_size": 1,
                "timeout_s": 5.0,
            },
            "height",
        ),
    ],
)
def test_the_validator_refuses_with_the_input_and_the_fix(
    nodes: dict[str, type], node: str, inputs: dict[str, object], words: str
) -> None:
    prompt = {"1": {"class_type": "WerkConnection", "inputs": _connection()}}
    linked = {"connection": ["1", 0]} if "connection" in nodes[node].INPUT_TYPES()["required"] else {}  # type: ignore[attr-defined]
    if node == "WerkDecode":
        prompt["0"] = {
            "class_type": "WerkPrefill",
            "inputs": {
                "connection": ["1", 0],
                "model": "m",
                "text": "t",
                "mode": "auto",
                "pin": False,
                "allow_experimental": False,
            },
        }
        linked = {"handoff": ["0", 0]}
    prompt["2"] = (
        {"class_type": node, "inputs": {**inputs, **linked}}
        if node != "WerkConnection"
        else {"class_type": node, "inputs": inputs}
    )
    errors = validate(prompt, nodes)
    assert list(errors) == ["2"], errors
    message = " ".join(e["message"] for e in errors["2"])
    assert words in message and ("Fix:" in message or errors["2"][0]["type"] != "custom_validation_failed"), message


def test_a_link_of_the_wrong_type_is_refused(nodes: dict[str, type]) -> None:
    prompt = {
        "1": {"class_type": "WerkConnection", "inputs": _connection()},
        "2": {"class_type": "WerkChat", "inputs": {**CHAT, "connection": ["1", 0]}},
        "3": {
            "class_type": "WerkDecode",
            "inputs": {
                "handoff": ["2", 0],
                "max_tokens": 4,
                "temperature": 0.0,
                "seed": 0,
                "allow_experimental": False,
            },
        },
    }
    assert validate(prompt, nodes)["3"][0]["type"] == "return_type_mismatch"


def test_the_key_comes_from_a_private_file_or_the_environment(
    nodes: dict[str, type], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = nodes["WerkConnection"]().run  # type: ignore[attr-defined]
    key_file = tmp_path / "key"
    key_file.write_text("sk-from-file\n")
    key_file.chmod(0o644)
    with pytest.raises(Exception, match="chmod 600"):
        run(**_connection(api_key_source="file", api_key_file=str(key_file)))
    key_file.chmod(0o600)
    (connection,) = run(**_connection(api_key_source="file", api_key_file=str(key_file)))
    assert connection.client.has_api_key and "sk-from-file" not in repr(connection)
    monkeypatch.delenv("WERK_NO_SUCH_KEY", raising=False)
    with pytest.raises(Exception, match="unauthorized.*WERK_NO_SUCH_KEY"):
        run(**_connection(api_key_source="environment", api_key_env="WERK_NO_SUCH_KEY"))


def test_expert_nodes_refuse_without_opt_in_before_any_request(nodes: dict[str, type]) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.5)
    accepted: list[object] = []

    def watch() -> None:
        with contextlib.suppress(OSError):
            accepted.append(listener.accept())

    watcher = threading.Thread(target=watch)
    watcher.start()
    port = listener.getsockname()[1]
    prompt = {
        "1": {"class_type": "WerkConnection", "inputs": _connection(base_url=f"http://127.0.0.1:{port}")},
        "2": {
            "class_type": "WerkExpertAction",
            "inputs": {
                "connection": ["1", 0],
                "model": "m",
                "expert_ids": "0,1",
                "action": "prefetch",
                "target_tier": "ram",
                "dry_run": True,
                "allow_experimental": False,
            },
        },
    }
    assert "experimental_opt_in_required" in validate(prompt, nodes)["2"][0]["message"]
    with pytest.raises(ExecutionError, match="experimental_opt_in_required"):
        execute(prompt, nodes)  # ComfyUI would not run it; the function refuses all the same
    watcher.join()
    listener.close()
    assert accepted == []


def test_a_refused_decode_input_leaves_the_handoff_unspent(nodes: dict[str, type]) -> None:
    prompt = {"1": {"class_type": "WerkConnection", "inputs": _connection(base_url="http://127.0.0.1:9")}}
    (connection,) = execute(prompt, nodes)["1"]
    module = sys.modules[nodes["WerkDecode"].__module__]  # the package ComfyUI loaded
    handoff = module.StateHandoff(connection, SecretStr(SECRET), "st_1", 3)
    bad = {"max_tokens": 0, "temperature": 0.0, "seed": 0, "allow_experimental": True}
    with pytest.raises(Exception, match="max_tokens"):
        nodes["WerkDecode"]().run(handoff, **bad)  # type: ignore[attr-defined]
    assert not handoff.spent

"""What the Ollama routes say and do from the serving instance's evidence, over the reference
backend: ``/api/show`` ``capabilities``, ``think`` against the verified reasoning profile,
``images`` against what the instance takes, tool turns, and ``/api/embed``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import falcon.testing
import pytest

from tests.compat.conftest import KEY
from werk_host import hookimpl
from werk_host.errors import ErrorCode, WerkError
from werk_host.http.ollama import PROBE_PNG
from werk_host.protocol import CapabilityId, CapabilityStatus, ChatRequest
from werk_host.testing.hosts import backend_host, make_host
from werk_host.testing.reference import MemoryBackendPlugin
from werk_host.testing.reference_adapter import MemoryAdapter
from werk_host.testing.reference_base import EXPERIMENTAL_STATE, PLUGIN_NAME

AUTH = {"Authorization": f"Bearer {KEY}"}
USER = [{"role": "user", "content": "name three colours"}]
SHORT = {"num_predict": 8}


class TextOnlyAdapter(MemoryAdapter):
    """A backend whose model takes text only and no tools, as its counting hook says."""

    @hookimpl(specname="werk_count_tokens")
    def count_tokens(self, request: ChatRequest) -> int:
        if request.tools or any(
            part.type != "text" for m in request.messages if isinstance(m.content, list) for part in m.content
        ):
            raise WerkError(ErrorCode.INVALID_REQUEST, "this model accepts text only")
        return super().count_tokens(request)


class TextOnly(MemoryBackendPlugin):
    adapter_class = TextOnlyAdapter


def _client(tmp_path: Path, name: str, **kwargs: Any) -> Iterator[falcon.testing.TestClient]:
    home = tmp_path / name
    home.mkdir()
    built = make_host(home, plugin_name=PLUGIN_NAME, operator_api_keys=(KEY,), **kwargs)
    try:
        yield falcon.testing.TestClient(built.app)
    finally:
        built.close()


@pytest.fixture
def text_only(tmp_path: Path) -> Iterator[falcon.testing.TestClient]:
    yield from _client(tmp_path, "text-only", plugin=TextOnly())


@pytest.fixture
def reasoning(tmp_path: Path) -> Iterator[falcon.testing.TestClient]:
    """The reference backend reporting its (verified) reasoning profile."""
    home = tmp_path / "reasoning"
    home.mkdir()
    statuses = {**EXPERIMENTAL_STATE, CapabilityId.REASONING: CapabilityStatus.SUPPORTED}
    built, _ = backend_host(home, operator_api_keys=(KEY,), adapter_kwargs={"statuses": statuses})
    try:
        yield falcon.testing.TestClient(built.app)
    finally:
        built.close()


def _post(client: falcon.testing.TestClient, path: str, body: object) -> falcon.testing.Result:
    return client.simulate_post(path, json=body, headers=AUTH)


def _capabilities(client: falcon.testing.TestClient) -> list[str]:
    shown = _post(client, "/api/show", {"model": "tiny"})
    assert shown.status_code == 200, shown.text
    found: list[str] = shown.json["capabilities"]
    return found


def _error(result: falcon.testing.Result, status: int) -> str:
    assert result.status_code == status, result.text
    assert set(result.json) == {"error"}, result.json
    message: str = result.json["error"]
    return message


def test_show_reports_what_the_running_instance_has_shown(
    client: falcon.testing.TestClient, text_only: falcon.testing.TestClient, reasoning: falcon.testing.TestClient
) -> None:
    assert _capabilities(client) == ["completion", "tools", "vision"]  # counts images and tools; no profile
    assert _capabilities(text_only) == ["completion"]
    assert _capabilities(reasoning) == ["completion", "tools", "thinking", "vision"]
    # a cold instance is not started to find out: only what every served model does
    assert _post(reasoning, "/api/generate", {"model": "tiny", "keep_alive": 0}).json["done_reason"] == "unload"
    assert _capabilities(reasoning) == ["completion"]
    states = reasoning.simulate_get("/werk/v1/deployments", headers=AUTH).json["data"]["inventory"]
    assert [s["state"] for s in states] == ["cold"]


def test_think_follows_the_verified_reasoning_profile(
    client: falcon.testing.TestClient, reasoning: falcon.testing.TestClient
) -> None:
    for think in (True, "low", "max"):
        body = {"model": "tiny:latest", "messages": USER, "think": think, "stream": False, "options": SHORT}
        assert _error(_post(client, "/api/chat", body), 400) == '"tiny:latest" does not support thinking'
        generate = {k: v for k, v in body.items() if k != "messages"} | {"prompt": "hi"}
        assert _error(_post(client, "/api/generate", generate), 400).endswith("support thinking")
    off = _post(client, "/api/chat", {"model": "tiny", "messages": USER, "think": False, "stream": False})
    assert off.status_code == 200, off.text
    # with a profile: the tier is asked for, and a cold instance is started to know its profile
    _post(reasoning, "/api/generate", {"model": "tiny", "keep_alive": 0})
    thinking = _post(reasoning, "/api/chat", {"model": "tiny", "messages": USER, "think": True, "stream": False})
    assert thinking.status_code == 200, thinking.text
    for think in (False, True):
        result = _post(reasoning, "/api/chat", {"model": "tiny", "messages": USER, "think": think, "options": SHORT})
        assert result.status_code == 200 and json.loads(result.text.splitlines()[-1])["done"] is True, result.text


def test_images_reach_an_instance_that_takes_them_and_are_refused_clearly_elsewhere(
    client: falcon.testing.TestClient, text_only: falcon.testing.TestClient
) -> None:
    messages = [{"role": "user", "content": "what is in this picture", "images": [PROBE_PNG]}]
    seen = _post(client, "/api/chat", {"model": "tiny", "messages": messages, "stream": False, "options": SHORT})
    assert seen.status_code == 200 and seen.json["message"]["content"] == "what is in this picture", seen.text
    refused = _post(text_only, "/api/chat", {"model": "tiny", "messages": messages, "stream": False})
    assert _error(refused, 400) == '"tiny" does not support images: the instance serving it takes text only'
    generated = _post(text_only, "/api/generate", {"model": "tiny", "prompt": "what", "images": [PROBE_PNG]})
    assert "does not support images" in _error(generated, 400)
    assert "base64" in _error(
        _post(client, "/api/chat", {"model": "tiny", "messages": [{**messages[0], "images": ["??"]}]}), 400
    )


def test_tools_and_a_tool_turn_are_served(client: falcon.testing.TestClient) -> None:
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    messages = [
        {"role": "user", "content": "weather in Toronto?"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather", "arguments": {}}}]},
        {"role": "tool", "content": "11 degrees celsius", "tool_name": "get_weather"},
    ]
    result = _post(client, "/api/chat", {"model": "tiny", "messages": messages, "tools": [tool], "stream": False})
    assert result.status_code == 200, result.text
    assert result.json["message"] == {"role": "assistant", "content": "11 degrees celsius"}  # the tool result echoed
    bad = {**tool, "function": {"name": "no spaces allowed"}}
    assert "[0].function.name" in _error(
        _post(client, "/api/chat", {"model": "tiny", "messages": USER, "tools": [bad]}), 400
    )


@pytest.mark.parametrize("path", ["/api/embed", "/api/embeddings"])
def test_embed_is_ollamas_error_naming_why(client: falcon.testing.TestClient, path: str) -> None:
    body = {"model": "tiny", "input": ["a", "b"]} if path == "/api/embed" else {"model": "tiny", "prompt": "a"}
    message = _error(_post(client, path, body), 400)
    assert message == '"tiny" does not support embeddings: it is a chat model'
    assert _error(_post(client, path, {**body, "model": "nope"}), 404)
    assert _error(_post(client, path, {"model": "tiny", "input": 1}), 400)
    assert _error(client.simulate_post(path, json=body), 401)

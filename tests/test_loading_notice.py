"""The loading notice (docs/deployments.md, "Loading notice"; werk_host/service/loading.py) with
the official SDKs over a real waitress server and the reference backend, whose start is held
until the test lets it go: the notice arrives while the instance is still starting (the start
cannot finish before the test releases it, so no clock is involved), the real answer follows
exactly as a warm instance's does (same deltas, finish and usage), a failed start ends the
stream with the API's own error event after the 200, and nothing changes when the notice is off
or the request is not streamed.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from werk_host.config import HostConfig
from werk_host.deployments.profile import ProfileError, parse_profile
from werk_host.errors import ErrorCode, WerkError
from werk_host.models import ModelManifest
from werk_host.testing.hosts import make_host, running
from werk_host.testing.reference import MemoryBackendPlugin
from werk_host.testing.reference_adapter import MemoryAdapter
from werk_host.testing.reference_base import PLUGIN_NAME

KEY = "sk-werk-notice-client-0123456789"
ON = '[[instance]]\nid = "a"\nmodel = "tiny"\n[residency]\nloading_notice = true\n'
OFF = '[[instance]]\nid = "a"\nmodel = "tiny"\n'
MESSAGES = [{"role": "user", "content": "one two three four"}]


class HeldStart(MemoryBackendPlugin):
    """The reference backend whose start waits for ``go`` (and then fails when ``broken``)."""

    def __init__(self) -> None:
        super().__init__()
        self.go = threading.Event()
        self.broken = False

    def create(self, config: HostConfig, model: ModelManifest | None) -> MemoryAdapter:
        self.go.wait(60)
        if self.broken:
            raise WerkError(ErrorCode.UNAVAILABLE, "injected start failure")
        return super().create(config, model)


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Any]:
    with ExitStack() as stack:
        plugins: list[HeldStart] = []

        def start(profile: str) -> tuple[str, HeldStart]:
            home = tmp_path / f"home{len(plugins)}"
            home.mkdir()
            path = home / "deployments.toml"
            path.write_text(profile)
            plugin = HeldStart()
            plugins.append(plugin)
            host = make_host(home, plugin=plugin, plugin_name=PLUGIN_NAME, profile=path, api_keys=(KEY,))
            return stack.enter_context(running(host)), plugin

        yield start
        for plugin in plugins:
            plugin.go.set()


def _openai(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=60)


def _deltas(chunks: list[Any]) -> list[tuple[str | None, str | None, str | None]]:
    """(content, reasoning, finish) of each chunk's first choice."""
    out = []
    for chunk in chunks:
        for choice in chunk.choices:
            reasoning = getattr(choice.delta, "reasoning_content", None)
            out.append((choice.delta.content, reasoning, choice.finish_reason))
    return out


def _stream(client: openai.OpenAI) -> Any:
    return client.chat.completions.create(
        model="a", messages=MESSAGES, max_tokens=3, stream=True, stream_options={"include_usage": True}
    )


def test_openai_stream_shows_the_notice_while_the_instance_starts_then_the_real_answer(serve: Any) -> None:
    url, plugin = serve(ON)
    with _openai(url) as client:
        stream = _stream(client)
        assert stream.response.status_code == 200
        assert stream.response.headers["X-Werk-Deployment"] == "a"
        events = iter(stream)
        first = next(events)  # arrives while the start is still held
        assert not plugin.adapters and not plugin.go.is_set()
        assert "Loading model a" in first.choices[0].delta.reasoning_content
        assert first.model_extra == {"werk_notice": "loading"}
        plugin.go.set()
        rest = list(events)
        ready, answer = rest[0], rest[1:]
        assert (
            ready.model_extra == {"werk_notice": "loading"} and "Ready in" in ready.choices[0].delta.reasoning_content
        )
        warm = list(_stream(client))  # the instance is ready now: no notice
        assert all(not c.model_extra for c in warm)
    assert _deltas(answer) == _deltas(warm)
    assert answer[-1].usage == warm[-1].usage and answer[-1].usage is not None
    assert len(plugin.adapters) == 1


def test_anthropic_stream_shows_the_notice_as_its_own_thinking_block(serve: Any) -> None:
    url, plugin = serve(ON)
    with anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0, timeout=60) as client:
        body: Any = {"model": "a", "max_tokens": 3, "messages": MESSAGES}
        with client.messages.stream(**body) as stream:
            events = iter(stream)
            head = [next(events) for _ in range(3)]  # message_start, the block, its first delta
            assert not plugin.adapters
            plugin.go.set()
            tail = list(events)
            message = stream.get_final_message()
        with client.messages.stream(**body) as warm_stream:
            warm = warm_stream.get_final_message()
    assert [e.type for e in head] == ["message_start", "content_block_start", "content_block_delta"]
    assert head[1].content_block.type == "thinking" and head[1].index == 0
    thinking, *content = message.content
    assert thinking.type == "thinking" and "Loading model a" in thinking.thinking and "Ready in" in thinking.thinking
    assert [b.model_dump() for b in content] == [b.model_dump() for b in warm.content]
    assert message.usage == warm.usage and message.stop_reason == warm.stop_reason
    assert [e.type for e in tail][-2:] == ["message_delta", "message_stop"]


def test_ollama_stream_shows_the_notice_in_the_thinking_field(serve: Any) -> None:
    url, plugin = serve(ON)
    body = {"model": "a", "messages": MESSAGES, "options": {"num_predict": 3}}
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", f"{url}/api/chat", json=body, headers=headers) as response:
            assert response.status_code == 200
            lines = response.iter_lines()
            first = json.loads(next(lines))
            assert "Loading model a" in first["message"]["thinking"] and not plugin.adapters
            plugin.go.set()
            rest = [json.loads(line) for line in lines if line]
        warm = [json.loads(line) for line in http.post(f"{url}/api/chat", json=body, headers=headers).iter_lines()]
    assert "Ready in" in rest[0]["message"]["thinking"]
    strip = {"created_at", "total_duration", "load_duration", "prompt_eval_duration", "eval_duration"}
    assert [{k: v for k, v in d.items() if k not in strip} for d in rest[1:]] == [
        {k: v for k, v in d.items() if k not in strip} for d in warm
    ]


def test_a_failed_start_ends_each_stream_with_its_apis_error_event(serve: Any) -> None:
    url, plugin = serve(ON)
    plugin.broken = True
    plugin.go.set()
    with _openai(url) as client:
        stream = _stream(client)
        assert stream.response.status_code == 200
        with pytest.raises(openai.APIError) as err:
            for _ in stream:
                pass
        assert "failed to start instance a" in str(err.value.message)
    with anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0, timeout=60) as client:
        body: Any = {"model": "a", "max_tokens": 3, "messages": MESSAGES}
        with pytest.raises(anthropic.APIStatusError) as failed, client.messages.stream(**body) as stream:
            list(stream)
        assert failed.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]
    with httpx.Client(timeout=60) as http:
        answer = http.post(
            f"{url}/api/chat", json={"model": "a", "messages": MESSAGES}, headers={"Authorization": f"Bearer {KEY}"}
        )
    lines = [json.loads(line) for line in answer.iter_lines() if line]
    assert answer.status_code == 200 and "failed to start instance a" in lines[-1]["error"], lines


def test_off_by_default_and_never_on_unstreamed_requests(serve: Any) -> None:
    url, plugin = serve(OFF)
    plugin.go.set()
    with _openai(url) as client:
        assert all(not c.model_extra for c in _stream(client))
    url, plugin = serve(ON)
    plugin.go.set()
    with _openai(url) as client:
        answer = client.chat.completions.create(model="a", messages=MESSAGES, max_tokens=3)  # type: ignore[arg-type]
        assert getattr(answer.choices[0].message, "reasoning_content", None) is None


def test_the_instance_setting_overrides_the_residency_one() -> None:
    text = ON.replace('model = "tiny"\n', 'model = "tiny"\nloading_notice = false\n', 1)
    profile = parse_profile(text, source="p.toml", known_model=lambda _name: True)
    assert profile.residency.loading_notice is True and profile.instances[0].loading_notice is False
    for bad, field in (("[residency]\nloading_notice = 1\n", "residency.loading_notice"),):
        with pytest.raises(ProfileError) as err:
            parse_profile(OFF + bad, source="p.toml", known_model=lambda _name: True)
        assert err.value.field == field
    with pytest.raises(ProfileError) as err:
        parse_profile(OFF + 'loading_notice = "yes"\n', source="p.toml", known_model=lambda _name: True)
    assert err.value.field == "instance[0].loading_notice"

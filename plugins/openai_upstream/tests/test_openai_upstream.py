"""werk-openai-upstream against a real llama-server as the upstream: chat and text completions,
streamed and not, through ``werk serve`` and the in-process host; a wrong key, an upstream that
is down, a path prefix and HTTPS, each answered with its reason; the key in no answer or log."""

from __future__ import annotations

import http.client
import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import SERVED, TlsFront, Upstream
from werk_openai_upstream import plugin

from werk_host.plugin.process import free_port
from werk_host.testing.api import Api
from werk_host.testing.hosts import LiveHost, serve_process, serving

KEY_ENV = "WERK_TEST_UPSTREAM_KEY"
WERK_KEY = f"sk-werk-{secrets.token_hex(8)}"
CHAT: dict[str, Any] = {"model": SERVED, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4}


def write_profile(directory: Path, endpoint: str, *, options: str = "", key_env: str | None = KEY_ENV) -> Path:
    lines = ["[[instance]]", 'id = "remote"', f'model = "{SERVED}"', 'backend = "openai_upstream"']
    lines += [f'endpoint = "{endpoint}"', "preload = true"]
    if key_env is not None:
        lines.append(f'api_key_env = "{key_env}"')
    if options:
        lines.append(f"options = {{ {options} }}")
    path = directory / f"profile-{secrets.token_hex(4)}.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def stream(api: Api, path: str, body: dict[str, Any]) -> tuple[int, list[str]]:
    """The status and the ``data:`` payloads of a streamed answer (the raw body otherwise)."""
    conn = http.client.HTTPConnection(api.host, api.port, timeout=60)
    try:
        headers = {"Authorization": f"Bearer {api.key}", "Content-Type": "application/json"}
        conn.request("POST", path, body=json.dumps({**body, "stream": True}).encode(), headers=headers)
        response = conn.getresponse()
        raw = response.read().decode()
    finally:
        conn.close()
    if not (response.getheader("Content-Type") or "").startswith("text/event-stream"):
        return response.status, [raw]
    return response.status, [line[5:].strip() for line in raw.splitlines() if line.startswith("data:")]


@pytest.fixture
def remote(upstream: Upstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[LiveHost, Upstream]]:
    """The in-process host with one remote instance on the upstream (the right key)."""
    monkeypatch.setenv(KEY_ENV, upstream.key)
    profile = write_profile(tmp_path, upstream.endpoint)
    with serving(tmp_path / "home", plugin=plugin, api_keys=(WERK_KEY,), with_model=False, profile=profile) as live:
        yield live, upstream


# -- through werk serve ---------------------------------------------------------------------------


def test_werk_serve_relays_chat_and_completions_streamed_and_not(upstream: Upstream, tmp_path: Path) -> None:
    profile = write_profile(tmp_path, upstream.endpoint)
    home = tmp_path / "home"
    env = {KEY_ENV: upstream.key, "WERK_DISABLE_PLUGINS": "llamacpp,vllm,candle,omlx,transformers,onnx_genai"}
    with serve_process(home, "--profile", str(profile), keys=(WERK_KEY,), env=env) as served:
        api = Api(served.url, WERK_KEY)
        status, doc = api.post("/v1/chat/completions", CHAT)
        assert status == 200, doc
        assert isinstance(doc["choices"][0]["message"]["content"], str)
        assert doc["usage"]["completion_tokens"] >= 1
        status, events = stream(api, "/v1/chat/completions", {**CHAT, "stream_options": {"include_usage": True}})
        assert status == 200 and events[-1] == "[DONE]", events
        chunks = [json.loads(e) for e in events[:-1]]
        assert any(c["choices"] and c["choices"][0]["delta"].get("content") for c in chunks), chunks
        assert chunks[-1]["usage"]["prompt_tokens"] >= 1
        text = {"model": SERVED, "prompt": "Once upon a time", "max_tokens": 3}
        status, doc = api.post("/v1/completions", text)
        assert status == 200 and isinstance(doc["choices"][0]["text"], str), doc
        status, events = stream(api, "/v1/completions", text)
        assert status == 200 and events[-1] == "[DONE]", events
        status, doc = api.get("/werk/v1/capabilities")
        residency = next(c for c in doc["data"] if c["id"] == "runtime.model_residency")
        assert residency["status"] == "externally_managed", residency
        status, doc = api.get("/werk/v1/chat/limits", model=SERVED)
        assert status == 200 and doc["data"]["context_tokens"] is None, doc  # unknown: null
    assert upstream.key not in served.log.read_text(errors="replace")


def test_werk_serve_with_a_wrong_key_answers_the_reason_and_logs_no_key(upstream: Upstream, tmp_path: Path) -> None:
    wrong = f"sk-wrong-{secrets.token_hex(8)}"
    profile = write_profile(tmp_path, upstream.endpoint)
    env = {KEY_ENV: wrong, "WERK_DISABLE_PLUGINS": "llamacpp,vllm,candle,omlx,transformers,onnx_genai"}
    with serve_process(tmp_path / "home", "--profile", str(profile), keys=(WERK_KEY,), env=env) as served:
        api = Api(served.url, WERK_KEY)
        status, doc = api.post("/v1/chat/completions", CHAT)
        assert status == 503, doc
        message = doc["error"]["message"]
        assert "refused the API key" in message and KEY_ENV in message, message
        assert "server log" not in message
        status, events = stream(api, "/v1/chat/completions", CHAT)
        assert status == 503 and "refused the API key" in events[0], events
        status, doc = api.get("/werk/v1/capabilities")
        residency = next(c for c in doc["data"] if c["id"] == "runtime.model_residency")
        assert residency["status"] == "unavailable" and "refused the API key" in residency["detail"], residency
        for answer in (json.dumps(doc), message, events[0]):
            assert wrong not in answer and upstream.key not in answer
    log = served.log.read_text(errors="replace")
    assert "refused" in log or "key" in log  # the operator's line
    assert wrong not in log and upstream.key not in log


# -- the in-process host ----------------------------------------------------------------------------


def test_an_upstream_that_is_down_answers_the_reason(
    upstream: Upstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, upstream.key)
    profile = write_profile(tmp_path, f"http://127.0.0.1:{free_port()}/v1")
    with serving(tmp_path / "home", plugin=plugin, api_keys=(WERK_KEY,), with_model=False, profile=profile) as live:
        status, doc = live.api.post("/v1/chat/completions", CHAT)
        assert status == 503, doc
        message = doc["error"]["message"]
        assert "is not answering (the connection was refused)" in message, message
        assert "127.0.0.1" not in message and upstream.key not in message


def test_an_upstream_that_goes_away_and_comes_back(remote: tuple[LiveHost, Upstream]) -> None:
    live, upstream = remote
    assert live.api.post("/v1/chat/completions", CHAT)[0] == 200
    upstream.stop()
    try:
        status, doc = live.api.post("/v1/chat/completions", CHAT)
        assert status == 503 and "not answering" in doc["error"]["message"], doc
        status, doc = live.api.get("/werk/v1/capabilities")
        residency = next(c for c in doc["data"] if c["id"] == "runtime.model_residency")
        assert residency["status"] == "unavailable", residency
    finally:
        upstream.start()
    adapter = live.host.fleet.adapter
    assert adapter is not None
    adapter_remote = adapter.remote  # type: ignore[attr-defined]
    adapter_remote.ready(SERVED, retry_s=0)  # re-probes at once
    assert live.api.post("/v1/chat/completions", CHAT)[0] == 200


def test_a_path_prefix(
    llama_server_path: Path, tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefixed = Upstream(llama_server_path, tiny_model, tmp_path / "llama.log", prefix="/openai")
    prefixed.start()
    try:
        monkeypatch.setenv(KEY_ENV, prefixed.key)
        profile = write_profile(tmp_path, prefixed.endpoint)  # http://127.0.0.1:P/openai/v1
        with serving(tmp_path / "home", plugin=plugin, api_keys=(WERK_KEY,), with_model=False, profile=profile) as live:
            status, doc = live.api.post("/v1/chat/completions", CHAT)
            assert status == 200, doc
    finally:
        prefixed.stop()


def test_https_with_a_ca_file_and_an_untrusted_certificate(
    upstream: Upstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    front = TlsFront(upstream.port, tmp_path)
    monkeypatch.setenv(KEY_ENV, upstream.key)
    try:
        endpoint = f"https://127.0.0.1:{front.port}/v1"
        trusted = write_profile(tmp_path, endpoint, options=f'ca_file = "{front.ca_file}"')
        with serving(tmp_path / "a", plugin=plugin, api_keys=(WERK_KEY,), with_model=False, profile=trusted) as live:
            status, doc = live.api.post("/v1/chat/completions", CHAT)
            assert status == 200, doc
            status, events = stream(live.api, "/v1/chat/completions", CHAT)
            assert status == 200 and events[-1] == "[DONE]", events
        untrusted = write_profile(tmp_path, endpoint)  # the system's trust store: not this certificate
        with serving(tmp_path / "b", plugin=plugin, api_keys=(WERK_KEY,), with_model=False, profile=untrusted) as live:
            status, doc = live.api.post("/v1/chat/completions", CHAT)
            assert status == 503, doc
            assert "over TLS (its TLS certificate is not trusted)" in doc["error"]["message"], doc
    finally:
        front.close()


def test_a_model_the_upstream_does_not_serve(
    upstream: Upstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, upstream.key)
    profile = write_profile(tmp_path, upstream.endpoint)
    profile.write_text(profile.read_text().replace(f'model = "{SERVED}"', 'model = "other-model"'))
    with serving(tmp_path / "home", plugin=plugin, api_keys=(WERK_KEY,), with_model=False, profile=profile) as live:
        status, doc = live.api.post("/v1/chat/completions", {**CHAT, "model": "other-model"})
        assert status == 503, doc
        assert "does not serve a model named other-model" in doc["error"]["message"], doc

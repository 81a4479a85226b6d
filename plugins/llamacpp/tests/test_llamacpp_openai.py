"""werk-llamacpp behind Werk's OpenAI-compatible ``/v1``, driven by the official ``openai`` client.

A real llama-server runs the generated test model. Its chat template is replaced (through
``WERK_LLAMA_ARGS``, the operator's channel) by a ChatML template that renders tool definitions,
assistant tool calls and tool results, so that passing tools through can be proven from the
child's own prompt token counts. The child's ``/metrics`` and ``/slots`` prove what did and did
not reach it.
"""

from __future__ import annotations

import http.client
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
from werk_llamacpp.adapter import LlamaCppAdapter
from werk_llamacpp.process import ENV_ARGS
from werk_llamacpp.testmodel import generate_model

from tests.support import covers_hooks
from tests.support.api import Api
from tests.support.hosts import running
from werk_host.config import HostConfig
from werk_host.models import ModelManifest, ModelRegistry
from werk_host.server import Host, build_host

pytestmark = pytest.mark.llamaserver
KEY = "sk-werk-openai-test-123456"
MODEL = "tiny"
CONTEXT = 2048  # -c 4096 over -np 2
CEILING = 256  # the manifest's max_output_tokens

TOOL_TEMPLATE = """\
{%- if tools %}<|im_start|>system
# Tools
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>
For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags.<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == "assistant" and message.tool_calls %}<|im_start|>assistant
{% for call in message.tool_calls %}<tool_call>
{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}
</tool_call>{% endfor %}<|im_end|>
{% elif message.role == "tool" %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}
"""

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
QUESTION: list[dict[str, Any]] = [{"role": "user", "content": "what is the weather in paris today?"}]
TOOL_HISTORY: list[dict[str, Any]] = [
    *QUESTION,
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 degrees"},
]


@dataclass
class Env:
    host: Host
    base: str
    api: Api
    client: openai.OpenAI
    secrets_on_disk: tuple[str, ...]  # filesystem paths that must never appear in a /v1 answer

    @property
    def adapter(self) -> LlamaCppAdapter:
        adapter = self.host.runtime.adapter
        assert isinstance(adapter, LlamaCppAdapter)
        return adapter

    def child(self, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
        """A raw call to the managed llama-server itself, bypassing Werk."""
        proc = self.adapter.current()
        assert proc is not None and proc.port is not None
        conn = http.client.HTTPConnection("127.0.0.1", proc.port, timeout=30)
        try:
            data = json.dumps(body).encode() if body is not None else None
            conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def metrics(self) -> dict[str, float]:
        status, raw = self.child("GET", "/metrics")
        assert status == 200, raw
        values: dict[str, float] = {}
        for line in raw.decode().splitlines():
            if line.startswith("llamacpp:"):
                name, _, value = line.partition(" ")
                values[name.removeprefix("llamacpp:")] = float(value)
        return values

    def slots(self) -> list[dict[str, Any]]:
        status, raw = self.child("GET", "/slots")
        assert status == 200, raw
        slots: list[dict[str, Any]] = json.loads(raw)
        return slots

    def count(self, **request: Any) -> int:
        status, body = self.api.post("/werk/v1/chat/count_tokens", request)
        assert status == 200, body
        assert body["data"]["model"] == MODEL
        tokens: int = body["data"]["input_tokens"]
        return tokens

    def chat_counters(self) -> dict[str, int]:
        status, body = self.api.get("/werk/v1/observability")
        assert status == 200, body
        counters: dict[str, int] = body["data"]["chat"]
        return counters

    def raw_v1(self, method: str, path: str, body: Any = None, key: str | None = KEY) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection(self.api.host, self.api.port, timeout=60)
        headers = {"Content-Type": "application/json"}
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        try:
            conn.request(method, path, body=json.dumps(body).encode() if body is not None else None, headers=headers)
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    def assert_no_paths(self, text: str | bytes) -> None:
        text = text.decode(errors="replace") if isinstance(text, bytes) else text
        assert ".gguf" not in text
        for secret in self.secrets_on_disk:
            assert secret not in text


def _install(home: Path, model: Path, ceiling: int) -> None:
    ModelRegistry(home).add(
        ModelManifest.from_paths(MODEL, [model], backend="llama.cpp", params={"max_output_tokens": ceiling})
    )


def _build(home: Path, server: Path, llama_args: str) -> Host:
    config = HostConfig(
        home=home,
        api_keys=(KEY,),
        model=MODEL,
        backend_options={"llamacpp": {"llama_server": str(server), "parallel": 2, "ctx": 4096, "threads": 1}},
    )
    with pytest.MonkeyPatch.context() as mp:  # the operator's trailing llama-server arguments
        mp.setenv(ENV_ARGS, llama_args)
        return build_host(config)



def _client(base: str, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, llama_server_path: Path, tiny_model: Path) -> Iterator[Env]:
    root = tmp_path_factory.mktemp("openai")
    home = root / "home"
    home.mkdir()
    template = root / "tools.jinja"
    template.write_text(TOOL_TEMPLATE)
    _install(home, tiny_model, CEILING)
    host = _build(home, llama_server_path, f"--chat-template-file {shlex.quote(str(template))}")
    with running(host) as base:
        yield Env(host, base, Api(base, KEY), _client(base), (str(tiny_model), str(home), str(root)))


@pytest.fixture(scope="module")
def slow_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wider, deeper random model: a few milliseconds per token, so a long generation lasts seconds."""
    return generate_model(tmp_path_factory.mktemp("slow") / "slow.gguf", dim=512, layers=4)


@pytest.fixture
def slow_env(tmp_path: Path, llama_server_path: Path, slow_model: Path) -> Iterator[Env]:
    home = tmp_path / "home"
    home.mkdir()
    _install(home, slow_model, CONTEXT - 1)
    host = _build(home, llama_server_path, "")
    with running(host) as base:
        yield Env(host, base, Api(base, KEY), _client(base), (str(slow_model), str(home)))


def _sse_events(resp: http.client.HTTPResponse) -> Iterator[tuple[float, bytes]]:
    """``(arrival time, data)`` of each server-sent event, read as the bytes arrive."""
    pending = b""
    while True:
        chunk = resp.read1(65536)
        if not chunk:
            return
        pending += chunk
        while b"\n\n" in pending:
            event, pending = pending.split(b"\n\n", 1)
            if event.startswith(b"data: "):
                yield time.monotonic(), event[len(b"data: ") :]


# -- models, chat, completions -------------------------------------------------------------------


@covers_hooks("werk_list_models")
def test_models_lists_the_manifest_name_and_no_path(env: Env) -> None:
    models = env.client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert models.data[0].object == "model"
    status, _, raw = env.raw_v1("GET", "/v1/models")
    assert status == 200
    env.assert_no_paths(raw)


@covers_hooks("werk_chat_completion")
def test_chat_completion_usage_matches_request_and_count(env: Env) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello there, model"}]
    reply = env.client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=8, temperature=0, seed=7, extra_body={"ignore_eos": True}  # type: ignore[arg-type]
    )
    assert reply.object == "chat.completion" and reply.model == MODEL
    (choice,) = reply.choices
    assert choice.finish_reason == "length" and isinstance(choice.message.content, str)
    assert reply.usage is not None
    assert reply.usage.completion_tokens == 8
    assert reply.usage.prompt_tokens == env.count(messages=messages)
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 8
    env.assert_no_paths(reply.model_dump_json())


def test_chat_streams_chunk_by_chunk_and_ends_with_done(env: Env) -> None:
    stream = env.client.chat.completions.create(
        model=MODEL,
        messages=QUESTION,  # type: ignore[arg-type]
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)  # the client stops at data: [DONE]
    content = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(content) > 1
    assert all(c.object == "chat.completion.chunk" and c.model == MODEL for c in chunks)
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 12 and usage.prompt_tokens == env.count(messages=QUESTION)

    # The same over raw HTTP: an event stream, relayed as events, terminated by [DONE].
    body = {"model": MODEL, "messages": QUESTION, "max_tokens": 6, "stream": True, "ignore_eos": True}
    status, headers, raw = env.raw_v1("POST", "/v1/chat/completions", body)
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    events = [e for e in raw.split(b"\n\n") if e]
    assert len(events) >= 7 and events[-1] == b"data: [DONE]"
    env.assert_no_paths(raw)


@covers_hooks("werk_text_completion")
def test_legacy_completions(env: Env) -> None:
    reply = env.client.completions.create(
        model=MODEL, prompt="the model says", max_tokens=5, temperature=0, extra_body={"ignore_eos": True}
    )
    assert reply.object == "text_completion" and reply.model == MODEL
    assert isinstance(reply.choices[0].text, str) and reply.choices[0].finish_reason == "length"
    assert reply.usage is not None and reply.usage.completion_tokens == 5 and reply.usage.prompt_tokens > 0
    stream = env.client.completions.create(
        model=MODEL, prompt="the model says", max_tokens=5, stream=True, extra_body={"ignore_eos": True}
    )
    pieces = list(stream)
    assert len([p for p in pieces if p.choices and p.choices[0].text]) > 1
    env.assert_no_paths(reply.model_dump_json())


def test_tools_tool_calls_and_results_reach_the_child(env: Env) -> None:
    plain, with_tools, history = env.count(messages=QUESTION), env.count(messages=QUESTION, tools=TOOLS), env.count(
        messages=TOOL_HISTORY, tools=TOOLS
    )
    # The template renders the tool schema and the earlier call/result: each adds many tokens.
    assert with_tools > plain + 50 and history > with_tools + 20
    for messages, expected in ((QUESTION, with_tools), (TOOL_HISTORY, history)):
        reply = env.client.chat.completions.create(
            model=MODEL, messages=messages, tools=TOOLS, max_tokens=4, temperature=0  # type: ignore[arg-type]
        )
        assert reply.usage is not None and reply.usage.prompt_tokens == expected  # what llama-server rendered
    stream = env.client.chat.completions.create(
        model=MODEL, messages=TOOL_HISTORY, tools=TOOLS, max_tokens=4, stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens == history


# -- count_tokens against the child's own counters ------------------------------------------------


@covers_hooks("werk_count_tokens")
def test_count_tokens_equals_the_childs_prompt_count(env: Env) -> None:
    requests: list[dict[str, Any]] = [
        {"messages": [{"role": "user", "content": "count me exactly"}]},
        {"messages": [{"role": "system", "content": "You are terse."}, *QUESTION]},
        {"messages": TOOL_HISTORY, "tools": TOOLS},
    ]
    for request in requests:
        counted = env.count(**request)
        reply = env.client.chat.completions.create(model=MODEL, max_tokens=2, temperature=0, **request)
        timings = (reply.model_extra or {})["timings"]  # llama-server's own per-request counters
        assert reply.usage is not None
        assert counted == reply.usage.prompt_tokens == timings["prompt_n"] + timings["cache_n"], request
        # a reasoning tier of "default" is accepted and does not change the count
        assert env.count(**request, werk={"reasoning": {"tier": "default"}}) == counted


# -- admission -------------------------------------------------------------------------------------


def _long_messages(env: Env, target: int) -> list[dict[str, Any]]:
    """A user message whose rendered prompt is just under ``target`` tokens."""
    words = 10
    while True:
        messages = [{"role": "user", "content": " ".join(["state"] * words)}]
        if env.count(messages=messages) >= target:
            return messages
        words += max((target - env.count(messages=messages)) // 2, 1)


@covers_hooks("werk_chat_limits")
def test_admission_rejects_oversized_requests_before_the_child(env: Env) -> None:
    limits = env.api.get("/werk/v1/chat/limits")[1]["data"]
    assert (limits["context_tokens"], limits["max_output_tokens"]) == (CONTEXT, CEILING)
    messages = _long_messages(env, CONTEXT - 200)
    prompt = env.count(messages=messages)
    assert prompt < CONTEXT and prompt + CEILING > CONTEXT  # fits alone, not with the output
    before, counters = env.metrics(), env.chat_counters()

    with pytest.raises(openai.BadRequestError) as raised:
        env.client.chat.completions.create(model=MODEL, messages=messages, max_tokens=CEILING)  # type: ignore[arg-type]
    err = raised.value
    assert err.status_code == 400 and err.code == "context_length_exceeded"
    assert isinstance(err.body, dict) and err.body["type"] == "invalid_request_error" and err.body["param"] is None
    assert str(prompt + CEILING) in err.body["message"] and str(CONTEXT) in err.body["message"]

    with pytest.raises(openai.BadRequestError) as raised:  # also when streaming: rejected before the stream
        env.client.chat.completions.create(model=MODEL, messages=messages, max_tokens=CEILING, stream=True)  # type: ignore[arg-type]
    assert raised.value.code == "context_length_exceeded"

    for output in ({"max_tokens": CEILING + 1}, {"max_completion_tokens": CEILING + 1}):
        with pytest.raises(openai.BadRequestError) as raised:
            env.client.chat.completions.create(model=MODEL, messages=QUESTION, **output)  # type: ignore[arg-type]
        assert raised.value.code == "output_limit_exceeded", output
        assert str(CEILING) in raised.value.message

    after = env.metrics()
    for counter in ("prompt_tokens_total", "prompt_tokens_cached_total", "tokens_predicted_total", "n_decode_total"):
        assert after[counter] == before[counter], counter  # nothing reached llama-server's inference
    assert not any(slot["is_processing"] for slot in env.slots())
    counted = env.chat_counters()
    assert counted["requests_rejected"] - counters["requests_rejected"] == 4
    assert counted["requests_total"] == counters["requests_total"]

    # The same prompt with an output that fits is admitted and does reach the child.
    reply = env.client.chat.completions.create(model=MODEL, messages=messages, max_tokens=CONTEXT - prompt, temperature=0)  # type: ignore[arg-type]
    assert reply.usage is not None and reply.usage.prompt_tokens == prompt
    assert env.metrics()["n_decode_total"] > after["n_decode_total"]


# -- disconnects -----------------------------------------------------------------------------------


def _stream_request(env: Env, max_tokens: int) -> tuple[socket.socket, http.client.HTTPResponse]:
    conn = http.client.HTTPConnection(env.api.host, env.api.port, timeout=60)
    body = {"model": MODEL, "messages": QUESTION, "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
    conn.request(
        "POST",
        "/v1/chat/completions",
        body=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"},
    )
    sock = conn.sock  # kept: http.client lets go of it once the response is open
    assert sock is not None
    resp = conn.getresponse()
    assert resp.status == 200
    return sock, resp


def _wait_idle(env: Env, timeout: float) -> float:
    """Seconds until no slot of the child is processing; fails after ``timeout``."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if not any(slot["is_processing"] for slot in env.slots()):
            return time.monotonic() - started
        time.sleep(0.02)
    pytest.fail(f"llama-server still generating {timeout}s after the client went away: {env.slots()}")


def test_stream_is_relayed_incrementally(slow_env: Env) -> None:
    sock, resp = _stream_request(slow_env, 200)
    try:
        started = time.monotonic()
        events = list(_sse_events(resp))
    finally:
        sock.close()
    assert events[-1][1] == b"[DONE]"
    tokens = [t for t, data in events if b'"content":"' in data]
    assert len(tokens) >= 150  # (bytes that are not valid UTF-8 yet are held back by llama-server)
    total = events[-1][0] - started
    # Events arrive spread over the generation, not in one burst at the end.
    assert tokens[0] - started < total / 2 and tokens[len(tokens) // 2] - started < total * 0.9, (tokens[0], total)


def test_client_disconnect_mid_stream_stops_the_child(slow_env: Env) -> None:
    max_tokens = 1500
    before = slow_env.metrics()
    sock, resp = _stream_request(slow_env, max_tokens)
    events = _sse_events(resp)
    for _ in range(3):
        next(events)
    assert any(slot["is_processing"] for slot in slow_env.slots())
    sock.shutdown(socket.SHUT_RDWR)  # the client goes away mid-stream
    sock.close()
    resp.close()
    gone = time.monotonic()
    idle_after = _wait_idle(slow_env, timeout=5)
    predicted = slow_env.metrics()["tokens_predicted_total"] - before["tokens_predicted_total"]
    per_token = max(predicted, 1) / max(time.monotonic() - gone, 1e-3)
    assert predicted < max_tokens / 2, (predicted, idle_after, per_token)  # stopped well before the end
    counters = slow_env.chat_counters()
    assert counters["requests_active"] == 0
    # The pool recovered: the next request is served normally.
    reply = slow_env.client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=3)  # type: ignore[arg-type]
    assert reply.choices[0].finish_reason in ("stop", "length")


def test_client_disconnect_before_a_non_streamed_answer_stops_the_child(slow_env: Env) -> None:
    max_tokens = 1500
    before, counters = slow_env.metrics(), slow_env.chat_counters()
    sock = socket.create_connection((slow_env.api.host, slow_env.api.port))
    body = json.dumps({"model": MODEL, "messages": QUESTION, "max_tokens": max_tokens, "ignore_eos": True}).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: werk\r\nAuthorization: Bearer {KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body)
    deadline = time.monotonic() + 5
    while not any(slot["is_processing"] for slot in slow_env.slots()):  # generating, nothing sent back yet
        assert time.monotonic() < deadline
        time.sleep(0.01)
    sock.close()  # the client gives up waiting
    _wait_idle(slow_env, timeout=5)
    predicted = slow_env.metrics()["tokens_predicted_total"] - before["tokens_predicted_total"]
    assert predicted < max_tokens / 2, predicted
    after = slow_env.chat_counters()
    assert after["requests_active"] == 0 and after["requests_total"] == counters["requests_total"] + 1
    assert after["requests_failed"] == counters["requests_failed"]  # a client leaving is not a failure


# -- reasoning tiers -------------------------------------------------------------------------------


@covers_hooks("werk_reasoning_profile")
def test_reasoning_tier_default_is_stripped_and_explicit_tiers_are_refused(env: Env) -> None:
    profile = env.api.get("/werk/v1/chat/reasoning")[1]["data"]
    assert profile["supported"] is False and profile["tiers"] == [] and profile["default_tier"] is None
    plain = env.client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=6, temperature=0, seed=3)  # type: ignore[arg-type]
    tiered = env.client.chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=6, temperature=0, seed=3,  # type: ignore[arg-type]
        extra_body={"werk": {"reasoning": {"tier": "default"}}},
    )
    assert tiered.choices[0].message.content == plain.choices[0].message.content  # the native default is kept
    before = env.metrics()
    for extra in (
        {"extra_body": {"werk": {"reasoning": {"tier": "low"}}}},
        {"extra_body": {"werk": {"reasoning": {"tier": "turbo"}}}},
        {"extra_body": {"werk": {"reasoning": {"tier": "default"}}}, "reasoning_effort": "low"},
    ):
        with pytest.raises(openai.BadRequestError) as raised:
            env.client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=4, **extra)  # type: ignore[call-overload]
        assert raised.value.code == "invalid_reasoning_tier", extra
    assert env.metrics()["n_decode_total"] == before["n_decode_total"]


# -- auth, errors, observability -------------------------------------------------------------------


def test_v1_uses_werk_keys_and_openai_error_shape(env: Env) -> None:
    with pytest.raises(openai.AuthenticationError) as raised:
        _client(env.base, "sk-not-a-werk-key-000000").models.list()
    assert raised.value.status_code == 401 and raised.value.code == "unauthorized"
    status, headers, raw = env.raw_v1("POST", "/v1/chat/completions", {"messages": QUESTION}, key=None)
    assert status == 401 and headers["www-authenticate"] == "Bearer"
    assert json.loads(raw) == {
        "error": {"message": "missing or invalid API key", "type": "authentication_error", "param": None, "code": "unauthorized"}
    }
    with pytest.raises(openai.NotFoundError) as missing:
        env.client.chat.completions.create(model="not-installed", messages=QUESTION)  # type: ignore[arg-type]
    assert missing.value.code == "model_not_found"
    status, _, raw = env.raw_v1("POST", "/v1/chat/completions", {"messages": []})
    assert status == 400 and json.loads(raw)["error"]["type"] == "invalid_request_error"


@covers_hooks("werk_workers")
def test_observability_counts_v1_requests(env: Env) -> None:
    before = env.chat_counters()
    chat = env.client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=3, extra_body={"ignore_eos": True})  # type: ignore[arg-type]
    streamed = list(env.client.chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=3, stream=True, stream_options={"include_usage": True},  # type: ignore[arg-type]
        extra_body={"ignore_eos": True},
    ))
    list(env.client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=3, stream=True))  # type: ignore[arg-type]
    text = env.client.completions.create(model=MODEL, prompt="hi", max_tokens=3, extra_body={"ignore_eos": True})
    with pytest.raises(openai.BadRequestError):
        env.client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=CEILING + 1)  # type: ignore[arg-type]
    after = env.chat_counters()
    assert after["requests_total"] - before["requests_total"] == 4
    assert after["requests_rejected"] - before["requests_rejected"] == 1
    assert after["requests_active"] == 0 and after["requests_failed"] == before["requests_failed"]
    # Token totals add what the backend reported in usage (a stream without include_usage reports none).
    reported = [r.usage for r in (chat, streamed[-1], text)]
    assert all(u is not None for u in reported)
    assert after["completion_tokens_total"] - before["completion_tokens_total"] == 9
    assert after["prompt_tokens_total"] - before["prompt_tokens_total"] == sum(u.prompt_tokens for u in reported if u)
    obs = env.api.get("/werk/v1/observability")[1]["data"]
    (worker,) = obs["workers"]
    assert worker["model"] == MODEL and worker["slots"] == 2
    assert obs["context_per_request_tokens"] == CONTEXT and obs["context_capacity_tokens"] == 2 * CONTEXT


# -- werk serve, unchanged client --------------------------------------------------------------------


def test_openai_client_against_werk_serve(tmp_path: Path, llama_server_path: Path, tiny_model: Path) -> None:
    home = tmp_path / "home"
    _install(home, tiny_model, CEILING)
    environ = {**os.environ, "WERK_HOME": str(home), "WERK_API_KEYS": KEY, "WERK_LLAMA_SERVER": str(llama_server_path)}
    environ.pop(ENV_ARGS, None)
    log = tmp_path / "serve.log"
    with open(log, "wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "werk_host", "serve", "--port", "0", "--model", MODEL],
            stdout=subprocess.PIPE, stderr=stderr, env=environ, text=True,
        )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, log.read_text()[-4000:]
        port = json.loads(line)["port"]
        client = _client(f"http://127.0.0.1:{port}")
        assert [m.id for m in client.models.list().data] == [MODEL]
        reply = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=4)  # type: ignore[arg-type]
        assert reply.model == MODEL and reply.usage is not None and reply.usage.completion_tokens <= 4
        chunks = list(client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=4, stream=True))  # type: ignore[arg-type]
        assert chunks and chunks[-1].choices[0].finish_reason in ("stop", "length")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

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
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from werk_llamacpp.adapter import LlamaCppAdapter
from werk_llamacpp.process import ENV_ARGS
from werk_llamacpp.testing.testmodel import generate_model

from werk_host.plugin import HostConfig, ModelManifest
from werk_host.plugin.http import ConnectionPool
from werk_host.testing.api import Api
from werk_host.testing.host import Host, ModelRegistry, build_host
from werk_host.testing.hosts import running
from werk_host.testing.markers import covers_hooks

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
        adapter = self.host.fleet.adapter
        assert isinstance(adapter, LlamaCppAdapter)
        return adapter

    def child(self, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
        """A raw call to the managed llama-server itself, bypassing Werk."""
        proc = self.adapter.current()
        assert proc is not None and proc.port is not None
        conn = http.client.HTTPConnection("127.0.0.1", proc.port, timeout=30)
        try:
            data = json.dumps(body).encode() if body is not None else None
            headers = {"Content-Type": "application/json", "Authorization": f"Bearer {proc.api_key}"}
            conn.request(method, path, body=data, headers=headers)
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

    def raw_v1(
        self, method: str, path: str, body: Any = None, key: str | None = KEY
    ) -> tuple[int, dict[str, str], bytes]:
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


def _build(home: Path, server: Path, llama_args: str, ctx: int = 2 * CONTEXT) -> Host:
    config = HostConfig(
        home=home,
        api_keys=(KEY,),
        model=MODEL,
        backend_options={"llamacpp": {"llama_server": str(server), "parallel": 2, "ctx": ctx, "threads": 1}},
    )
    with pytest.MonkeyPatch.context() as mp:  # the operator's trailing llama-server arguments
        mp.setenv(ENV_ARGS, llama_args)
        return build_host(config)


def _client(base: str, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=60)


def chat(client: openai.OpenAI, **request: Any) -> ChatCompletion:
    """``client.chat.completions.create`` (untyped request dicts; ``model`` defaults to the served one)."""
    request.setdefault("model", MODEL)
    reply: ChatCompletion = client.chat.completions.create(**request)
    return reply


def chat_stream(client: openai.OpenAI, **request: Any) -> list[ChatCompletionChunk]:
    """A streamed chat completion, read to the end (the client stops at ``data: [DONE]``)."""
    request.setdefault("model", MODEL)
    stream: openai.Stream[ChatCompletionChunk] = client.chat.completions.create(stream=True, **request)
    return list(stream)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, llama_server_path: Path, tiny_model: Path) -> Iterator[Env]:
    root = tmp_path_factory.mktemp("openai")
    home = root / "home"
    home.mkdir()
    template = root / "tools.jinja"
    template.write_text(TOOL_TEMPLATE)
    _install(home, tiny_model, CEILING)
    host = _build(home, llama_server_path, f"--chat-template-file {shlex.quote(str(template))}")
    with running(host) as base, _client(base) as client:
        yield Env(host, base, Api(base, KEY), client, (str(tiny_model), str(home), str(root)))


SLOW_CONTEXT = 8192
LONG_OUTPUT = 6000  # tokens: seconds of generation for the slow model, were it not cancelled


@pytest.fixture(scope="module")
def slow_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wider, deeper random model: milliseconds per token, so a long generation lasts seconds."""
    return generate_model(tmp_path_factory.mktemp("slow") / "slow.gguf", dim=512, layers=4, ctx=SLOW_CONTEXT)


@pytest.fixture
def slow_env(tmp_path: Path, llama_server_path: Path, slow_model: Path) -> Iterator[Env]:
    home = tmp_path / "home"
    home.mkdir()
    _install(home, slow_model, SLOW_CONTEXT - 1)
    host = _build(home, llama_server_path, "", ctx=2 * SLOW_CONTEXT)
    with running(host) as base, _client(base) as client:
        yield Env(host, base, Api(base, KEY), client, (str(slow_model), str(home)))


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
    reply = chat(env.client, messages=messages, max_tokens=8, temperature=0, seed=7, extra_body={"ignore_eos": True})
    assert reply.object == "chat.completion" and reply.model == MODEL
    (choice,) = reply.choices
    assert choice.finish_reason == "length" and isinstance(choice.message.content, str)
    assert reply.usage is not None
    assert reply.usage.completion_tokens == 8
    assert reply.usage.prompt_tokens == env.count(messages=messages)
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 8
    env.assert_no_paths(reply.model_dump_json())


def test_each_request_reaches_the_child_once_over_one_pooled_connection(env: Env) -> None:
    proc = env.adapter.current()
    assert proc is not None
    pool = env.adapter.proxy_pool(proc)
    chat(env.client, messages=QUESTION, max_tokens=2)
    before, upstream = env.metrics(), [c.sock.getsockname() for _, c in pool._idle if c.sock is not None]
    for _ in range(5):
        reply = chat(env.client, messages=QUESTION, max_tokens=8, extra_body={"ignore_eos": True})
        assert reply.usage is not None and reply.usage.completion_tokens == 8
    _wait_idle(env, timeout=5)
    # exactly the tokens the five answers report: no request was sent twice
    assert env.metrics()["tokens_predicted_total"] - before["tokens_predicted_total"] == 5 * 8
    after = [c.sock.getsockname() for _, c in pool._idle if c.sock is not None]
    assert upstream and after == upstream  # the same keep-alive connection to the child every time


@contextmanager
def _stale_connection(pool: ConnectionPool) -> Iterator[http.client.HTTPConnection]:
    """Put a kept-alive connection whose server has hung up on top of ``pool``."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        stale = http.client.HTTPConnection("127.0.0.1", listener.getsockname()[1], timeout=5)
        stale.connect()
        listener.accept()[0].close()
        pool.release(stale)
        yield stale
    assert stale.sock is None  # it was taken, failed, and dropped


def test_a_pooled_connection_closed_by_the_server_is_replaced(env: Env) -> None:
    proc = env.adapter.current()
    assert proc is not None
    pool = env.adapter.proxy_pool(proc)
    request: dict[str, Any] = {"messages": QUESTION, "max_tokens": 4, "ignore_eos": True}
    with _stale_connection(pool):  # an uncached count meets it
        counted = env.count(**request)
    before = env.metrics()
    with _stale_connection(pool):  # the count is cached now: the generation meets it
        reply = chat(env.client, messages=QUESTION, max_tokens=4, extra_body={"ignore_eos": True})
    assert reply.usage is not None and reply.usage.completion_tokens == 4 and reply.usage.prompt_tokens == counted
    _wait_idle(env, timeout=5)
    # sent again on a fresh connection, and run once
    assert env.metrics()["tokens_predicted_total"] - before["tokens_predicted_total"] == 4


def test_chat_streams_chunk_by_chunk_and_ends_with_done(env: Env) -> None:
    chunks = chat_stream(
        env.client,
        messages=QUESTION,
        max_tokens=12,
        temperature=0,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
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
    plain, with_tools, history = (
        env.count(messages=QUESTION),
        env.count(messages=QUESTION, tools=TOOLS),
        env.count(messages=TOOL_HISTORY, tools=TOOLS),
    )
    # The template renders the tool schema and the earlier call/result: each adds many tokens.
    assert with_tools > plain + 50 and history > with_tools + 20
    for messages, expected in ((QUESTION, with_tools), (TOOL_HISTORY, history)):
        reply = chat(env.client, messages=messages, tools=TOOLS, max_tokens=4, temperature=0)
        assert reply.usage is not None and reply.usage.prompt_tokens == expected  # what llama-server rendered
    chunks = chat_stream(
        env.client, messages=TOOL_HISTORY, tools=TOOLS, max_tokens=4, stream_options={"include_usage": True}
    )
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
        reply = chat(env.client, max_tokens=2, temperature=0, **request)
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
        chat(env.client, messages=messages, max_tokens=CEILING)
    err = raised.value
    assert err.status_code == 400 and err.code == "context_length_exceeded"
    assert isinstance(err.body, dict) and err.body["type"] == "invalid_request_error" and err.body["param"] is None
    assert str(prompt + CEILING) in err.body["message"] and str(CONTEXT) in err.body["message"]

    with pytest.raises(openai.BadRequestError) as raised:  # also when streaming: rejected before the stream
        chat_stream(env.client, messages=messages, max_tokens=CEILING)
    assert raised.value.code == "context_length_exceeded"

    for output in ({"max_tokens": CEILING + 1}, {"max_completion_tokens": CEILING + 1}):
        with pytest.raises(openai.BadRequestError) as raised:
            chat(env.client, messages=QUESTION, **output)
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
    reply = chat(env.client, messages=messages, max_tokens=CONTEXT - prompt, temperature=0)
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


def _wait_idle(env: Env, timeout: float, every: float = 0.02) -> float:
    """Seconds until no slot of the child is processing; fails after ``timeout``.

    Each ``/slots`` call wakes llama-server's result waiters, and a waiter for a non-streamed
    request checks its client's connection only after a full second without wake-ups: watch such
    requests with ``every`` above one second.
    """
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        time.sleep(every)
        if not any(slot["is_processing"] for slot in env.slots()):
            return time.monotonic() - started
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
    max_tokens = LONG_OUTPUT
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
    assert predicted < max_tokens / 4, (predicted, idle_after, time.monotonic() - gone)  # stopped well before the end
    counters = slow_env.chat_counters()
    assert counters["requests_active"] == 0
    # The pool recovered: the next request is served normally.
    reply = chat(slow_env.client, messages=QUESTION, max_tokens=3)
    assert reply.choices[0].finish_reason in ("stop", "length")


def test_client_disconnect_before_a_non_streamed_answer_stops_the_child(slow_env: Env) -> None:
    max_tokens = LONG_OUTPUT
    before, counters = slow_env.metrics(), slow_env.chat_counters()
    sock = socket.create_connection((slow_env.api.host, slow_env.api.port))
    body = json.dumps({"model": MODEL, "messages": QUESTION, "max_tokens": max_tokens, "ignore_eos": True}).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body)
    deadline = time.monotonic() + 5
    while not any(slot["is_processing"] for slot in slow_env.slots()):  # generating, nothing sent back yet
        assert time.monotonic() < deadline
        time.sleep(0.01)
    sock.close()  # the client gives up waiting
    gone = time.monotonic()
    idle_after = _wait_idle(slow_env, timeout=8, every=1.3)
    predicted = slow_env.metrics()["tokens_predicted_total"] - before["tokens_predicted_total"]
    assert predicted < max_tokens / 2, (predicted, idle_after, time.monotonic() - gone)
    after = slow_env.chat_counters()
    assert after["requests_active"] == 0 and after["requests_total"] == counters["requests_total"] + 1
    assert after["requests_failed"] == counters["requests_failed"]  # a client leaving is not a failure


# -- reasoning tiers -------------------------------------------------------------------------------


@covers_hooks("werk_reasoning_profile")
def test_reasoning_tier_default_is_stripped_and_explicit_tiers_are_refused(env: Env) -> None:
    profile = env.api.get("/werk/v1/chat/reasoning")[1]["data"]
    assert profile["supported"] is False and profile["tiers"] == [] and profile["default_tier"] is None
    plain = chat(env.client, messages=QUESTION, max_tokens=6, temperature=0, seed=3)
    tiered = chat(
        env.client,
        messages=QUESTION,
        max_tokens=6,
        temperature=0,
        seed=3,
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
            chat(env.client, messages=QUESTION, max_tokens=4, **extra)
        assert raised.value.code == "invalid_reasoning_tier", extra
    assert env.metrics()["n_decode_total"] == before["n_decode_total"]
    # Planning requests carry the same option and fail the same way (in the Werk envelope).
    assert env.count(messages=QUESTION, werk={"reasoning": {"tier": "default"}}) == env.count(messages=QUESTION)
    refused: list[dict[str, Any]] = [
        {"werk": {"reasoning": {"tier": "low"}}},
        {"werk": {"reasoning": {"tier": "default"}}, "reasoning_effort": "low"},
    ]
    for route in ("/werk/v1/chat/count_tokens", "/werk/v1/chat/admission"):
        for extra in refused:
            status, body = env.api.post(route, {"messages": QUESTION, **extra})
            assert (status, body["error"]["code"]) == (400, "invalid_request"), (route, extra, body)


# -- auth, errors, observability -------------------------------------------------------------------


def test_v1_uses_werk_keys_and_openai_error_shape(env: Env) -> None:
    with pytest.raises(openai.AuthenticationError) as raised:
        _client(env.base, "sk-not-a-werk-key-000000").models.list()
    assert raised.value.status_code == 401 and raised.value.code == "unauthorized"
    status, headers, raw = env.raw_v1("POST", "/v1/chat/completions", {"messages": QUESTION}, key=None)
    assert status == 401 and headers["www-authenticate"] == "Bearer"
    assert json.loads(raw) == {
        "error": {
            "message": "missing or invalid API key",
            "type": "authentication_error",
            "param": None,
            "code": "unauthorized",
        }
    }
    with pytest.raises(openai.NotFoundError) as missing:
        chat(env.client, model="not-installed", messages=QUESTION)
    assert missing.value.code == "model_not_found"
    status, _, raw = env.raw_v1("POST", "/v1/chat/completions", {"messages": []})
    assert status == 400 and json.loads(raw)["error"]["type"] == "invalid_request_error"
    status, _, raw = env.raw_v1("POST", "/v1/embeddings", {"input": "x"})
    assert status == 400 and json.loads(raw)["error"]["type"] == "invalid_request_error"
    status, _, raw = env.raw_v1("POST", "/v1/assistants", {"model": "x"})
    assert status == 404 and json.loads(raw)["error"]["type"] == "not_found_error"
    status, headers, raw = env.raw_v1("GET", "/v1/chat/completions")
    assert status == 405 and set(json.loads(raw)) == {"error"} and "POST" in headers["allow"]


@covers_hooks("werk_workers")
def test_observability_counts_v1_requests(env: Env) -> None:
    before = env.chat_counters()
    plain = chat(env.client, messages=QUESTION, max_tokens=3, extra_body={"ignore_eos": True})
    streamed = chat_stream(
        env.client,
        messages=QUESTION,
        max_tokens=3,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chat_stream(env.client, messages=QUESTION, max_tokens=3)
    text = env.client.completions.create(model=MODEL, prompt="hi", max_tokens=3, extra_body={"ignore_eos": True})
    with pytest.raises(openai.BadRequestError):
        chat(env.client, messages=QUESTION, max_tokens=CEILING + 1)
    after = env.chat_counters()
    assert after["requests_total"] - before["requests_total"] == 4
    assert after["requests_rejected"] - before["requests_rejected"] == 1
    assert after["requests_active"] == 0 and after["requests_failed"] == before["requests_failed"]
    # Token totals add what the backend reported in usage (a stream without include_usage reports none).
    reported = [r.usage for r in (plain, streamed[-1], text)]
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
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=environ,
            text=True,
        )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, log.read_text()[-4000:]
        port = json.loads(line)["port"]
        client = _client(f"http://127.0.0.1:{port}")
        assert [m.id for m in client.models.list().data] == [MODEL]
        reply = chat(client, messages=QUESTION, max_tokens=4)
        assert reply.model == MODEL and reply.usage is not None and reply.usage.completion_tokens <= 4
        chunks = chat_stream(client, messages=QUESTION, max_tokens=4)
        assert chunks and chunks[-1].choices[0].finish_reason in ("stop", "length")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- hardening: backend error text never reaches the client ------------------------------------

RAW_BACKEND_TEXT = ("json.exception", "type_error", "parser", "grammar", "mmproj", "schema error")


@pytest.mark.parametrize(
    "extra",
    [
        {"n_probs": "many"},  # llama-server: "[json.exception.type_error.302] type must be number ..."
        {"grammar": "root ::= ((("},  # "failed to parse grammar"
        {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "nope"}}}},
    ],
)
def test_backend_error_text_is_replaced_by_an_openai_error(env: Env, extra: dict[str, Any]) -> None:
    status, headers, raw = env.raw_v1(
        "POST", "/v1/chat/completions", {"model": MODEL, "messages": QUESTION, "max_tokens": 4, **extra}
    )
    assert status == 400, raw
    assert headers["content-type"].startswith("application/json")
    error = json.loads(raw)["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_request"
    assert not any(word in raw.decode().lower() for word in RAW_BACKEND_TEXT), raw
    env.assert_no_paths(raw)
    with pytest.raises(openai.BadRequestError):
        chat(env.client, messages=QUESTION, max_tokens=4, extra_body=extra)


def test_media_parts_on_a_text_model_are_400_everywhere(env: Env) -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    messages = [{"role": "user", "content": [{"type": "text", "text": "what is this?"}, image]}]
    status, body = env.api.post("/werk/v1/chat/count_tokens", {"messages": messages})
    assert status == 400 and body["error"]["code"] == "invalid_request" and body["error"]["retryable"] is False
    status, _, raw = env.raw_v1("POST", "/v1/chat/completions", {"model": MODEL, "messages": messages, "max_tokens": 4})
    assert status == 400, raw
    assert "mmproj" not in raw.decode()


@pytest.mark.parametrize(
    "message",
    [{"role": "user"}, {"role": "0", "content": "hi"}, {"role": "user", "content": [{"type": "text"}]}],
)
def test_count_tokens_client_errors_are_400_not_503(env: Env, message: dict[str, Any]) -> None:
    status, body = env.api.post("/werk/v1/chat/count_tokens", {"messages": [message]})
    assert status == 400, body
    assert body["error"]["code"] == "invalid_request" and body["error"]["retryable"] is False


def test_capability_details_carry_no_pid(env: Env) -> None:
    proc = env.adapter.current()
    assert proc is not None and proc.pid is not None
    status, body = env.api.get("/werk/v1/capabilities")
    assert status == 200
    assert f"pid {proc.pid}" not in json.dumps(body) and str(proc.pid) not in json.dumps(body["data"])

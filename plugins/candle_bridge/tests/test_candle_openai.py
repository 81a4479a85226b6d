"""The real SmolLM2-135M-Instruct on the engine behind Werk's ``/v1``, driven by the official
``openai`` client and by raw sockets (disconnects). Prompts are kept to a few tokens: the engine
prefills this model at a few tokens per second on a shared CPU."""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
from werk_candle_bridge import plugin
from werk_candle_bridge.adapter import CandleAdapter

from werk_host.plugin import ModelManifest
from werk_host.testing.api import Api
from werk_host.testing.hosts import LiveHost, serving

pytestmark = pytest.mark.engine
KEY = "sk-werk-candle-openai-4242"
MODEL = "smol"
CEILING = 4000
QUESTION = [
    {"role": "system", "content": "Answer in one word."},
    {"role": "user", "content": "What is the capital of France?"},
]
#: A generation that would run for minutes: a client that leaves must stop it.
ENDLESS = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 3000, "ignore_eos": True, "temperature": 0}
#: How long a short request may wait behind an endless one that was (not) stopped.
FOLLOW_UP_TIMEOUT_S = 60


@dataclass
class Env:
    live: LiveHost
    client: openai.OpenAI
    model_path: Path

    @property
    def api(self) -> Api:
        return self.live.api

    @property
    def adapter(self) -> CandleAdapter:
        adapter = self.live.host.fleet.adapter
        assert isinstance(adapter, CandleAdapter)
        return adapter

    def counters(self) -> dict[str, Any]:
        status, doc = self.api.get("/werk/v1/observability")
        assert status == 200, doc
        chat: dict[str, Any] = doc["data"]["chat"]
        return chat

    def worker(self) -> dict[str, Any]:
        status, doc = self.api.get("/werk/v1/observability")
        assert status == 200, doc
        workers = doc["data"]["workers"]
        assert len(workers) == 1, workers
        worker: dict[str, Any] = workers[0]
        return worker


@pytest.fixture(scope="module")
def env(smollm2_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    home = tmp_path_factory.mktemp("candle-openai") / "home"
    manifest = ModelManifest.from_paths(MODEL, [smollm2_gguf], backend="candle", params={"max_output_tokens": CEILING})
    with serving(home, plugin=plugin, model=manifest, api_keys=(KEY,)) as live:
        client = openai.OpenAI(base_url=f"{live.url}/v1", api_key=KEY, max_retries=0, timeout=300)
        yield Env(live, client, smollm2_gguf)


def test_streamed_chat_through_the_sdk(env: Env) -> None:
    stream = env.client.chat.completions.create(
        model=MODEL,
        messages=QUESTION,  # type: ignore[arg-type]
        max_tokens=6,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "Paris" in text
    assert chunks[0].choices[0].delta.role == "assistant"
    finishing = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finishing) == 1 and finishing[0].choices[0].finish_reason in ("stop", "length")
    usage = chunks[-1].usage
    assert usage is not None and not chunks[-1].choices
    assert 0 < usage.completion_tokens <= 6
    status, doc = env.api.post("/werk/v1/chat/count_tokens", {"model": MODEL, "messages": QUESTION})
    assert status == 200, doc
    assert doc["data"]["input_tokens"] == usage.prompt_tokens  # exact, with the model's own template
    assert all(c.model == MODEL for c in chunks)


def test_completions_streamed_and_not_agree(env: Env) -> None:
    whole = env.client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=3, temperature=0)
    assert "Paris" in whole.choices[0].text
    assert whole.usage is not None and whole.usage.completion_tokens == 3
    assert whole.choices[0].finish_reason == "length"
    pieces = list(
        env.client.completions.create(
            model=MODEL, prompt="The capital of France is", max_tokens=3, temperature=0, stream=True
        )
    )
    assert "".join(p.choices[0].text for p in pieces if p.choices) == whole.choices[0].text
    assert pieces[-1].usage is not None and pieces[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_refused_options_consume_nothing(env: Env) -> None:
    before = env.counters()
    status, doc = env.api.post(
        "/v1/chat/completions", {"model": MODEL, "messages": QUESTION, "max_tokens": 2, "seed": 1}
    )
    assert status == 400 and doc["error"]["code"] == "invalid_request" and "seed" in doc["error"]["message"]
    status, doc = env.api.post("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": CEILING + 1})
    assert status == 400 and doc["error"]["code"] == "output_limit_exceeded", doc
    status, doc = env.api.post("/v1/completions", {"model": MODEL, "prompt": "x " * 4500, "max_tokens": CEILING})
    assert status == 400 and doc["error"]["code"] == "context_length_exceeded", doc
    after = env.counters()
    assert after["prompt_tokens_total"] == before["prompt_tokens_total"]
    assert after["completion_tokens_total"] == before["completion_tokens_total"]


def _open_stream(env: Env) -> tuple[socket.socket, http.client.HTTPResponse]:
    conn = http.client.HTTPConnection(env.api.host, env.api.port, timeout=120)
    body = json.dumps({**ENDLESS, "stream": True}).encode()
    conn.request(
        "POST",
        "/v1/completions",
        body=body,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"},
    )
    sock = conn.sock  # kept: http.client lets go of it once the response is open
    assert sock is not None
    resp = conn.getresponse()
    assert resp.status == 200
    return sock, resp


def _follow_up_is_served(env: Env) -> None:
    """With one sequence at a time, a short request finishes only after the endless one ended:
    served well within the time the endless one needs, it proves that one was stopped."""
    quick = openai.OpenAI(base_url=f"{env.live.url}/v1", api_key=KEY, max_retries=0, timeout=FOLLOW_UP_TIMEOUT_S)
    reply = quick.completions.create(model=MODEL, prompt="Hello", max_tokens=1, temperature=0)
    assert reply.usage is not None and reply.usage.completion_tokens == 1


def _settled(env: Env) -> dict[str, Any]:
    deadline = time.monotonic() + 10
    while True:
        worker, counters = env.worker(), env.counters()
        if (worker["requests_running"], worker["requests_waiting"], counters["requests_active"]) == (0, 0, 0):
            return counters
        assert time.monotonic() < deadline, (worker, counters)
        time.sleep(0.05)


def test_client_leaving_a_stream_stops_the_generation(env: Env) -> None:
    before = env.counters()
    sock, resp = _open_stream(env)
    seen = 0
    while seen < 3:
        line = resp.readline()
        seen += line.startswith(b"data: {")
    assert env.worker()["requests_running"] == 1
    sock.shutdown(socket.SHUT_RDWR)  # the client goes away mid-stream
    sock.close()
    resp.close()
    _follow_up_is_served(env)
    after = _settled(env)
    assert after["requests_failed"] == before["requests_failed"]  # a client leaving is not a failure


def test_client_leaving_before_a_whole_answer_stops_the_generation(env: Env) -> None:
    sock = socket.create_connection((env.api.host, env.api.port))
    body = json.dumps(ENDLESS).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body)
    deadline = time.monotonic() + 60
    while env.worker()["requests_running"] < 1:  # generating, nothing sent back yet
        assert time.monotonic() < deadline
        time.sleep(0.05)
    sock.close()  # the client gives up waiting
    _follow_up_is_served(env)
    _settled(env)


def test_workers_and_plan_describe_the_loaded_engine(env: Env) -> None:
    worker = env.worker()
    assert worker["backend"] == "candle" and worker["model"] == MODEL and worker["slots"] == 1
    assert worker["context_per_request_tokens"] == 8192
    status, doc = env.api.get("/werk/v1/deployments")
    assert status == 200, doc
    plan = doc["data"]["plans"][0]["plan"]
    assert plan["parallel_slots"] == 1 and plan["context_per_slot"] == 8192
    assert "prefix_cache_n=0" in plan["arguments"] and all(str(env.model_path) not in a for a in plan["arguments"])

"""The three official SDKs (``openai``, ``anthropic``, ``ollama``) against ``werk serve`` with a
real llama-server running the real SmolLM2-135M-Instruct (its own chat template, exact counts).

Each SDK holds a non-streamed and a streamed two-turn conversation through its own protocol;
the input counts each answer reports equal what token counting says for the same
conversation, and all three are counted by the same observability. A client that leaves in the
middle of an Anthropic or Ollama answer stops the generation in the llama-server child (seen
in the child's own ``/slots`` and ``/metrics``, on a host served in this process).
"""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import ollama
import openai
import pytest
from werk_llamacpp.adapter import LlamaCppAdapter
from werk_llamacpp.process import ENV_ARGS

from werk_host.plugin import HostConfig, ModelManifest
from werk_host.testing.api import Api
from werk_host.testing.host import Host, ModelRegistry, build_host
from werk_host.testing.hosts import running, serve_process

pytestmark = pytest.mark.llamaserver
KEY = "sk-werk-sdk-test-8812"
MODEL = "smollm2"
SYSTEM = "You are a helpful assistant. Answer in one short sentence."
FIRST = "What is the capital of France?"
SECOND = "And what is the capital of Italy?"
ANSWER_TOKENS = 24
#: Greedy SmolLM2 tells this story in a loop: without cancellation it runs to ``LONG`` tokens.
STORY = "Write a very long story about a dragon."
LONG = 4000


def _install(home: Path, gguf: Path) -> None:
    home.mkdir(parents=True, exist_ok=True)
    ModelRegistry(home).add(ModelManifest.from_paths(MODEL, [gguf], backend="llama.cpp"))


@dataclass
class Served:
    url: str
    api: Api

    def count(self, messages: list[dict[str, Any]]) -> int:
        """Werk's exact input count of an OpenAI-shaped conversation."""
        status, body = self.api.post("/werk/v1/chat/count_tokens", {"model": MODEL, "messages": messages})
        assert status == 200, body
        tokens: int = body["data"]["input_tokens"]
        return tokens

    def chat_counters(self) -> dict[str, int]:
        status, body = self.api.get("/werk/v1/observability")
        assert status == 200, body
        counters: dict[str, int] = body["data"]["chat"]
        return counters


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, llama_server_path: Path, smollm2_gguf: Path) -> Iterator[Served]:
    """``werk serve --model smollm2`` in its own process, keyed."""
    root = tmp_path_factory.mktemp("sdks")
    home = root / "home"
    _install(home, smollm2_gguf)
    environ = {"WERK_LLAMA_SERVER": str(llama_server_path)}
    with serve_process(home, "--model", MODEL, keys=(KEY,), env=environ, drop=(ENV_ARGS,)) as served:
        url = served.url
        yield Served(url, Api(url, KEY))


def _openai_turns(*turns: str) -> list[dict[str, Any]]:
    """System, then alternating user/assistant turns, as OpenAI messages."""
    roles = ("user", "assistant")
    return [{"role": "system", "content": SYSTEM}, *({"role": roles[i % 2], "content": t} for i, t in enumerate(turns))]


# -- openai --------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_openai_sdk_conversation(served: Served, stream: bool) -> None:
    def ask(client: openai.OpenAI, messages: list[dict[str, Any]]) -> tuple[str, int]:
        options: dict[str, Any] = {"model": MODEL, "messages": messages, "max_tokens": ANSWER_TOKENS, "temperature": 0}
        if not stream:
            reply = client.chat.completions.create(**options)
            assert reply.usage is not None and reply.choices[0].finish_reason in ("stop", "length")
            return reply.choices[0].message.content or "", reply.usage.prompt_tokens
        chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **options))
        usage = chunks[-1].usage
        assert usage is not None
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), usage.prompt_tokens

    with openai.OpenAI(base_url=f"{served.url}/v1", api_key=KEY, max_retries=0, timeout=120) as client:
        first, prompt = ask(client, _openai_turns(FIRST))
        assert first.strip() and prompt == served.count(_openai_turns(FIRST))
        second, prompt = ask(client, _openai_turns(FIRST, first, SECOND))
    assert second.strip() and prompt == served.count(_openai_turns(FIRST, first, SECOND))


# -- anthropic -----------------------------------------------------------------------------------


def _anthropic_turns(*turns: str) -> list[anthropic.types.MessageParam]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_anthropic_sdk_conversation(served: Served, stream: bool) -> None:
    # the system prompt as a string, or as a text block: the same prompt either way
    system: Any = [{"type": "text", "text": SYSTEM}] if stream else SYSTEM

    def ask(client: anthropic.Anthropic, messages: list[anthropic.types.MessageParam]) -> anthropic.types.Message:
        # current SDKs no longer name temperature; the route still takes it, as older clients send it
        options: dict[str, Any] = {
            "model": MODEL,
            "system": system,
            "messages": messages,
            "max_tokens": ANSWER_TOKENS,
            "extra_body": {"temperature": 0},
        }
        if not stream:
            return client.messages.create(**options)
        with client.messages.stream(**options) as events:
            text = "".join(events.text_stream)
            final = events.get_final_message()
        assert "".join(b.text for b in final.content if b.type == "text") == text
        return final

    with anthropic.Anthropic(base_url=served.url, api_key=KEY, max_retries=0, timeout=120) as client:
        first = ask(client, _anthropic_turns(FIRST))
        first_text = "".join(b.text for b in first.content if b.type == "text")
        conversation = _anthropic_turns(FIRST, first_text, SECOND)
        second = ask(client, conversation)
        counted = client.messages.count_tokens(model=MODEL, system=system, messages=conversation)
    assert first_text.strip() and first.stop_reason in ("end_turn", "max_tokens")
    assert [b.type for b in second.content] == ["text"] and second.stop_reason in ("end_turn", "max_tokens")
    # exact counts: the SDK's count, the answer's usage and Werk's own count of the same turns
    # (the answer's input_tokens leave out what llama-server took from its cache: cache_read_input_tokens)
    total = second.usage.input_tokens + (second.usage.cache_read_input_tokens or 0)
    assert total == counted.input_tokens == served.count(_openai_turns(FIRST, first_text, SECOND))
    assert 0 < second.usage.output_tokens <= ANSWER_TOKENS


def test_anthropic_sdk_sees_the_serving_instance_and_typed_errors(served: Served) -> None:
    with anthropic.Anthropic(base_url=served.url, api_key=KEY, max_retries=0, timeout=120) as client:
        raw = client.messages.with_raw_response.create(model=MODEL, messages=_anthropic_turns(FIRST), max_tokens=2)
        assert raw.headers["x-werk-deployment"] == MODEL and raw.parse().usage.output_tokens <= 2
        # max_tokens is a ceiling (docs/compat.md, "Output budget"): clamped, named in a header;
        # the stream is left at its headers, which stops the generation
        with client.messages.with_streaming_response.create(
            model=MODEL, messages=_anthropic_turns(FIRST), max_tokens=1 << 20, stream=True
        ) as clamped:
            assert clamped.status_code == 200 and int(clamped.headers["x-werk-max-tokens-applied"]) < 1 << 20
        image: Any = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
        with pytest.raises(anthropic.BadRequestError) as text_only:
            client.messages.create(model=MODEL, messages=[{"role": "user", "content": [image]}], max_tokens=2)
        with pytest.raises(anthropic.NotFoundError):
            client.messages.create(model="nope", messages=_anthropic_turns(FIRST), max_tokens=2)
    assert "gguf" not in str(text_only.value) and text_only.value.status_code == 400
    assert "text content parts only" in str(text_only.value)  # no projector: the model takes no images


# -- ollama --------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_ollama_sdk_conversation(served: Served, stream: bool) -> None:
    options = {"num_predict": ANSWER_TOKENS, "temperature": 0, "num_ctx": 2048}

    def ask(client: ollama.Client, messages: list[dict[str, Any]]) -> tuple[str, ollama.ChatResponse]:
        if not stream:
            reply = client.chat(model=MODEL, messages=messages, options=options)
            return reply.message.content or "", reply
        parts = list(client.chat(model=MODEL, messages=messages, options=options, stream=True))
        assert all(not p.done for p in parts[:-1]) and parts[-1].done
        return "".join(p.message.content or "" for p in parts), parts[-1]

    with ollama.Client(host=served.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=120) as client:
        assert MODEL in [m.model for m in client.list().models]
        first, done = ask(client, _openai_turns(FIRST))
        # prompt_eval_count: the prompt tokens llama-server evaluated, not those it took from its cache
        assert first.strip() and 0 < (done.prompt_eval_count or 0) <= served.count(_openai_turns(FIRST))
        second, done = ask(client, _openai_turns(FIRST, first, SECOND))
    assert second.strip() and done.done_reason in ("stop", "length")
    # the second turn re-reads only what follows the first (its prefix stayed in llama-server's slot)
    assert 0 < (done.prompt_eval_count or 0) < served.count(_openai_turns(FIRST, first, SECOND))
    assert done.eval_count is not None and 0 < done.eval_count <= ANSWER_TOKENS


def test_ollama_sdk_models_and_errors(served: Served) -> None:
    with ollama.Client(host=served.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=120) as client:
        running = {m.model: m for m in client.ps().models}
        shown = client.show(f"{MODEL}:latest")
        # num_ctx cannot resize a running instance's context: accepted, no effect (docs/compat.md)
        wide = client.chat(model=MODEL, messages=_openai_turns(FIRST), options={"num_ctx": 1 << 20, "num_predict": 2})
        assert wide.done and client.show(MODEL).parameters == shown.parameters
    context = running[MODEL].context_length
    assert context is not None and shown.parameters == f"num_ctx {context}"
    with ollama.Client(host=served.url) as keyless, pytest.raises(ollama.ResponseError) as unauthorized:
        keyless.list()
    assert unauthorized.value.status_code == 401


# -- one observability -----------------------------------------------------------------------------


def test_all_three_protocols_are_counted_alike(served: Served) -> None:
    before = served.chat_counters()
    turns = _openai_turns(FIRST)
    with openai.OpenAI(base_url=f"{served.url}/v1", api_key=KEY, max_retries=0, timeout=120) as client:
        a = client.chat.completions.create(model=MODEL, messages=turns, max_tokens=4, temperature=0)
    with anthropic.Anthropic(base_url=served.url, api_key=KEY, max_retries=0, timeout=120) as client:
        b = client.messages.create(model=MODEL, system=SYSTEM, messages=_anthropic_turns(FIRST), max_tokens=4)
    with ollama.Client(host=served.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=120) as client:
        c = client.chat(model=MODEL, messages=turns, options={"num_predict": 4})
    # the same prompt: OpenAI's prompt_tokens, Anthropic's input and cache-read tokens; Ollama's
    # prompt_eval_count is what was evaluated (the rest came from the cache)
    assert a.usage is not None and a.usage.prompt_tokens == b.usage.input_tokens + (
        b.usage.cache_read_input_tokens or 0
    )
    assert 0 < (c.prompt_eval_count or 0) <= a.usage.prompt_tokens
    after = served.chat_counters()
    assert after["requests_total"] - before["requests_total"] == 3 and after["requests_active"] == 0
    assert after["prompt_tokens_total"] - before["prompt_tokens_total"] == 3 * a.usage.prompt_tokens
    completion = a.usage.completion_tokens + b.usage.output_tokens + (c.eval_count or 0)
    assert after["completion_tokens_total"] - before["completion_tokens_total"] == completion


# -- a client that leaves stops the generation --------------------------------------------------------


@dataclass
class Local:
    host: Host
    api: Api

    def child(self, path: str) -> Any:
        adapter = self.host.fleet.adapter
        assert isinstance(adapter, LlamaCppAdapter)
        proc = adapter.current()
        assert proc is not None and proc.port is not None
        conn = http.client.HTTPConnection("127.0.0.1", proc.port, timeout=30)
        try:
            conn.request("GET", path, headers={"Authorization": f"Bearer {proc.api_key}"})
            resp = conn.getresponse()
            raw = resp.read()
            assert resp.status == 200, raw
            return json.loads(raw) if path == "/slots" else raw.decode()
        finally:
            conn.close()

    def predicted(self) -> float:
        for line in self.child("/metrics").splitlines():
            if line.startswith("llamacpp:tokens_predicted_total "):
                return float(line.split()[1])
        raise AssertionError("llama-server reports no tokens_predicted_total")

    def generating(self) -> bool:
        return any(slot["is_processing"] for slot in self.child("/slots"))


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory, llama_server_path: Path, smollm2_gguf: Path) -> Iterator[Local]:
    """The host ``werk serve`` runs, served in this process so that the test can watch its child."""
    home = tmp_path_factory.mktemp("sdks-local") / "home"
    _install(home, smollm2_gguf)
    options = {"llama_server": str(llama_server_path), "parallel": 1, "ctx": 8192, "threads": 1}
    config = HostConfig(home=home, api_keys=(KEY,), model=MODEL, backend_options={"llamacpp": options})
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv(ENV_ARGS, raising=False)
        host = build_host(config)
    with running(host) as url:
        yield Local(host, Api(url, KEY))


def _send(local: Local, path: str, body: dict[str, Any], headers: dict[str, str]) -> socket.socket:
    sock = socket.create_connection((local.api.host, local.api.port))
    data = json.dumps(body).encode()
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n{head}"
        f"Content-Length: {len(data)}\r\n\r\n".encode()
        + data
    )
    return sock


def _read_until(sock: socket.socket, marker: bytes, times: int) -> None:
    """Read the answer until ``marker`` has arrived ``times`` times (the stream is flowing)."""
    seen = b""
    sock.settimeout(60)
    while seen.count(marker) < times:
        chunk = sock.recv(65536)
        assert chunk, seen[-500:]
        seen += chunk


def _wait_idle(local: Local, timeout: float, every: float) -> None:
    """Until no slot of the child is processing; fails after ``timeout``. A waiter for a
    non-streamed request checks its connection only after a second without wake-ups, so such
    requests are watched with ``every`` above one second."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        time.sleep(every)
        if not local.generating():
            return
    pytest.fail(f"llama-server still generating {timeout}s after the client went away")


STORY_REQUESTS = {
    "anthropic-stream": (
        "/v1/messages",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": STORY}],
            "max_tokens": LONG,
            "temperature": 0,
            "stream": True,
        },
        {"x-api-key": KEY, "anthropic-version": "2023-06-01"},
        b"content_block_delta",
    ),
    "ollama-stream": (
        "/api/chat",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": STORY}],
            "options": {"num_predict": LONG, "temperature": 0},
        },
        {"Authorization": f"Bearer {KEY}"},
        b'"done":false',
    ),
    "ollama-json": (
        "/api/generate",
        {"model": MODEL, "prompt": STORY, "stream": False, "options": {"num_predict": LONG, "temperature": 0}},
        {"Authorization": f"Bearer {KEY}"},
        None,
    ),
}


@pytest.mark.parametrize("case", sorted(STORY_REQUESTS))
def test_a_client_that_leaves_stops_the_generation(local: Local, case: str) -> None:
    path, body, headers, marker = STORY_REQUESTS[case]
    before = local.predicted()
    counters = local.api.get("/werk/v1/observability")[1]["data"]["chat"]
    sock = _send(local, path, body, headers)
    if marker is not None:
        _read_until(sock, marker, 5)  # tokens are streaming back
    else:
        deadline = time.monotonic() + 30
        while not local.generating():  # generating, nothing sent back yet
            assert time.monotonic() < deadline
            time.sleep(0.01)
    assert local.generating()
    sock.shutdown(socket.SHUT_RDWR)  # the client goes away
    sock.close()
    _wait_idle(local, timeout=10, every=0.05 if marker is not None else 1.3)
    predicted = local.predicted() - before
    assert predicted < LONG / 4, predicted  # stopped well before the end
    after = local.api.get("/werk/v1/observability")[1]["data"]["chat"]
    assert after["requests_active"] == 0 and after["requests_total"] == counters["requests_total"] + 1
    assert after["requests_failed"] == counters["requests_failed"]  # a client leaving is not a failure
    status, _ = local.api.post(
        "/werk/v1/chat/count_tokens", {"model": MODEL, "messages": [{"role": "user", "content": STORY}]}
    )
    assert status == 200  # the child serves the next request

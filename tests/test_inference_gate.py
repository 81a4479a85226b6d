"""Inference never starves control routes (docs/operations.md, "Inference concurrency").

Real sockets against a real waitress server: a backend plugin holds every streamed chat open
until the test releases it, so the test decides how many streams are running. Every socket
read has a timeout and the held streams end by themselves after :data:`HOLD_S`, so a test that
regresses fails in bounded time instead of hanging.
"""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.gate_support import TIMEOUT_S, control_routes_answer
from werk_host import hookimpl
from werk_host.cli import main
from werk_host.config import ServerLimits
from werk_host.errors import ErrorCode, WerkError
from werk_host.protocol import ChatLimits
from werk_host.seam import InferenceResponse, JsonObject
from werk_host.service.gate import RETRY_AFTER, GateLimits, InferenceGate, gate_limits
from werk_host.testing.hosts import MODEL, make_host, running
from werk_host.testing.reference import PLUGIN_NAME, MemoryAdapter, MemoryBackendPlugin

KEYS = ("sk-gate-key-one-0001", "sk-gate-key-two-0002", "sk-gate-key-three-003", "sk-gate-key-four-0004")
#: The longest a held stream stays open if a test never releases it.
HOLD_S = 60.0


class HeldAdapter(MemoryAdapter):
    """The reference adapter whose streamed chats send their first event, then hold (sending a
    keep-alive comment every few milliseconds, so that a client that left is noticed) until its
    plugin's ``release`` is set; it reports its plugin's ``capacity`` concurrent requests."""

    plugin: HeldStreams

    @hookimpl(specname="werk_chat_limits")
    def chat_limits(self, model: str | None) -> ChatLimits:
        limits = super().chat_limits(model)
        return limits.model_copy(
            update={"max_concurrent_requests": self.plugin.capacity, "engine_queues": self.plugin.engine_queues}
        )

    @hookimpl(specname="werk_chat_completion")
    def chat_completion(self, request: JsonObject) -> InferenceResponse:
        if request.get("stream") is not True:
            return super().chat_completion(request)
        plugin = self.plugin
        closed = threading.Event()
        with plugin.lock:
            plugin.open += 1

        def body() -> Iterator[bytes]:
            try:
                yield b'data: {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "tiny", '
                yield b'"choices": [{"index": 0, "delta": {"role": "assistant", "content": "held"}}]}\n\n'
                for _ in range(int(HOLD_S / 0.02)):
                    if plugin.release.wait(0.02) or closed.is_set():
                        break
                    yield b": held\n\n"
                yield b"data: [DONE]\n\n"
            finally:
                with plugin.lock:
                    plugin.open -= 1

        return InferenceResponse(200, {"Content-Type": "text/event-stream"}, body(), closed.set)


class HeldStreams(MemoryBackendPlugin):
    """The reference plugin whose adapters hold streamed chats (:class:`HeldAdapter`) and report
    ``capacity`` concurrent requests per instance; ``open`` counts the streams held."""

    adapter_class = HeldAdapter

    def __init__(self, capacity: int | None, engine_queues: bool = False) -> None:
        super().__init__()
        self.capacity = capacity
        self.engine_queues = engine_queues
        self.release = threading.Event()
        self.open = 0
        self.lock = threading.Lock()


@dataclass
class Stream:
    """One request sent on its own connection; ``status`` is ``None`` until answered, or when
    it timed out."""

    conn: http.client.HTTPConnection
    status: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    response: http.client.HTTPResponse | None = None

    def answer(self, timeout: float = TIMEOUT_S) -> int | None:
        assert self.conn.sock is not None
        self.conn.sock.settimeout(timeout)
        try:
            self.response = self.conn.getresponse()
        except TimeoutError:
            return None
        self.status = self.response.status
        self.headers = {k.lower(): v for k, v in self.response.getheaders()}
        return self.status

    def document(self) -> Any:
        assert self.response is not None
        return json.loads(self.response.read())


@dataclass
class Live:
    url: str
    plugin: HeldStreams
    port: int
    opened: list[Stream] = field(default_factory=list)

    def send(self, path: str, body: JsonObject, key: str = KEYS[0]) -> Stream:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=TIMEOUT_S)
        data = json.dumps(body).encode()
        headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        conn.request("POST", path, body=data, headers=headers)
        stream = Stream(conn)
        self.opened.append(stream)
        return stream

    def chat(self, key: str = KEYS[0]) -> Stream:
        return self.send(
            "/v1/chat/completions", {"model": MODEL, "max_tokens": 8, "messages": [_HI], "stream": True}, key
        )


_HI: JsonObject = {"role": "user", "content": "hello there"}


@contextmanager
def live_host(home: Path, *, capacity: int | None = 64, engine_queues: bool = False, **limits: Any) -> Iterator[Live]:
    plugin = HeldStreams(capacity, engine_queues)
    host = make_host(
        home, api_keys=KEYS, plugin=plugin, plugin_name=PLUGIN_NAME, limits=ServerLimits(threads=8, **limits)
    )
    with running(host) as url:
        live = Live(url, plugin, int(url.rsplit(":", 1)[1]))
        try:
            yield live
        finally:
            plugin.release.set()
            for stream in live.opened:
                stream.conn.close()


def _started(live: Live, streams: list[Stream]) -> list[int | None]:
    return [stream.answer() for stream in streams]


def _retry_after(stream: Stream) -> int:
    return int(stream.headers["retry-after"])


# -- the starvation of issue 28, item 2 ------------------------------------------------------


def test_control_routes_answer_for_every_key_while_streams_hold_the_inference_bound(home: Path) -> None:
    """12 long streams on an 8-thread server: the host-wide bound (8 - 2 = 6) runs six, the
    others are refused at once with 503 and ``Retry-After``, and every control route answers
    every key while the six stream. Without the gate the streams take all 8 threads and the
    control routes time out."""
    with live_host(home) as live:
        streams = [live.chat(KEYS[i % len(KEYS)]) for i in range(12)]
        statuses = _started(live, streams)
        control_routes_answer(live.port, KEYS, "inference streams")
        assert sorted(statuses, key=str) == [200] * 6 + [503] * 6, statuses
        for stream in streams:
            if stream.status == 503:
                assert _retry_after(stream) >= 1
                assert stream.document()["error"]["type"] == "server_error"
        assert live.plugin.open == 6
        live.plugin.release.set()
        for stream in streams:
            if stream.status == 200:
                assert stream.response is not None
                assert stream.response.read().endswith(b"data: [DONE]\n\n")
        # every ticket is back: a new full round of six streams is admitted
        again = [live.chat(KEYS[i % len(KEYS)]) for i in range(6)]
        assert _started(live, again) == [200] * 6


def test_one_key_at_its_bound_is_429_everywhere_and_another_key_still_streams(home: Path) -> None:
    """The per-key bound (half of 6 = 3): key one's fourth request is Anthropic's, OpenAI's and
    Ollama's 429 with ``Retry-After``, while key two streams."""
    with live_host(home) as live:
        assert _started(live, [live.chat(KEYS[0]) for _ in range(3)]) == [200] * 3
        openai = live.chat(KEYS[0])
        anthropic = live.send(
            "/v1/messages", {"model": MODEL, "max_tokens": 8, "messages": [_HI], "stream": True}, KEYS[0]
        )
        ollama = live.send("/api/chat", {"model": MODEL, "messages": [_HI], "options": {"num_predict": 8}}, KEYS[0])
        assert _started(live, [openai, anthropic, ollama]) == [429, 429, 429]
        assert openai.document()["error"]["type"] == "rate_limit_error"
        doc = anthropic.document()
        assert (doc["type"], doc["error"]["type"]) == ("error", "rate_limit_error")
        assert set(ollama.document()) == {"error"}
        assert all(_retry_after(s) >= 1 for s in (openai, anthropic, ollama))
        other = live.chat(KEYS[1])
        assert other.answer() == 200


def test_host_wide_refusal_in_each_protocol_shape(home: Path) -> None:
    """Over the host-wide bound: OpenAI 503 ``server_error``, Anthropic 529
    ``overloaded_error``, Ollama 503 ``{"error"}``, each with ``Retry-After``."""
    with live_host(home) as live:
        assert _started(live, [live.chat(KEYS[i % 2]) for i in range(6)]) == [200] * 6
        openai = live.chat(KEYS[2])
        anthropic = live.send("/v1/messages", {"model": MODEL, "max_tokens": 8, "messages": [_HI]}, KEYS[2])
        ollama = live.send(
            "/api/generate", {"model": MODEL, "prompt": "hi", "stream": False, "options": {"num_predict": 8}}, KEYS[3]
        )
        assert _started(live, [openai, anthropic, ollama]) == [503, 529, 503]
        assert openai.document()["error"]["type"] == "server_error"
        assert anthropic.document()["error"]["type"] == "overloaded_error"
        assert isinstance(ollama.document()["error"], str)
        assert all(_retry_after(s) >= 1 for s in (openai, anthropic, ollama))


# -- per-instance capacity and its queue -----------------------------------------------------


def test_a_full_instance_queues_then_seats_in_order(home: Path) -> None:
    """Capacity 1 (the backend's own figure) and a queue of 1: the second request waits and is
    seated when the first ends; a third, past the queue, is 503 at once."""
    with live_host(home, capacity=1, inference_queue=1, inference_wait_s=HOLD_S) as live:
        first = live.chat(KEYS[0])
        assert first.answer() == 200
        second = live.chat(KEYS[1])
        assert second.answer(timeout=0.5) is None  # queued: no answer while the first runs
        third = live.chat(KEYS[2])
        assert third.answer() == 503
        assert _retry_after(third) >= 1
        live.plugin.release.set()
        assert first.response is not None and first.response.read().endswith(b"[DONE]\n\n")
        assert second.answer() == 200


def test_by_default_one_keys_whole_allowance_waits_on_a_one_slot_instance(home: Path) -> None:
    """The default queue is the per-key bound (3 here): a key's three streams on a one-slot
    instance run one after the other, none refused."""
    with live_host(home, capacity=1) as live:
        streams = [live.chat(KEYS[0])]
        assert streams[0].answer() == 200  # running before the others arrive: they cannot overtake it
        streams += [live.chat(KEYS[0]) for _ in range(2)]
        assert [s.answer(timeout=0.5) for s in streams[1:]] == [None, None]  # both queued
        live.plugin.release.set()
        assert [s.answer() for s in streams[1:]] == [200, 200]


@pytest.mark.parametrize("engine_queues", [False, True])
def test_an_unknown_capacity_is_the_slots_bound_unless_the_engine_queues(home: Path, engine_queues: bool) -> None:
    """A backend that reports no capacity runs ``--inference-slots`` (2 here) at once and the
    others wait in Werk's queue; one whose engine queues the excess itself (vLLM, a remote
    server: ``engine_queues``) gets all five at once, the host-wide bound (6) still above them."""
    with live_host(
        home, capacity=None, engine_queues=engine_queues, inference_slots=2, inference_wait_s=HOLD_S
    ) as live:
        streams = [live.chat(KEYS[i % 2]) for i in range(5)]
        running = 5 if engine_queues else 2
        statuses = [s.answer(timeout=0.5 if i >= running else TIMEOUT_S) for i, s in enumerate(streams)]
        assert sorted(statuses, key=str) == [200] * running + [None] * (5 - running), statuses
        assert live.plugin.open == running
        live.plugin.release.set()
        assert [s.answer() if s.status is None else s.status for s in streams] == [200] * 5
        # the host's own member: never on the wire (GET /werk/v1/chat/limits has the protocol's fields)
        conn = http.client.HTTPConnection("127.0.0.1", live.port, timeout=TIMEOUT_S)
        conn.request("GET", "/werk/v1/chat/limits", headers={"Authorization": f"Bearer {KEYS[0]}"})
        limits = json.loads(conn.getresponse().read())["data"]
        conn.close()
        assert set(limits) == {
            "schema_version",
            "model",
            "context_tokens",
            "max_output_tokens",
            "max_concurrent_requests",
        }
        assert limits["max_concurrent_requests"] is None


def test_a_queued_request_is_refused_when_its_wait_runs_out(home: Path) -> None:
    with live_host(home, capacity=1, inference_queue=4, inference_wait_s=0.3) as live:
        assert live.chat(KEYS[0]).answer() == 200
        queued = live.chat(KEYS[1])
        assert queued.answer() == 503
        assert _retry_after(queued) >= 1
        assert "capacity" in queued.document()["error"]["message"]


def test_a_client_that_leaves_gives_its_place_back(home: Path) -> None:
    """A stream whose client disconnects releases its ticket: the key's bound frees again."""
    with live_host(home) as live:
        held = [live.chat(KEYS[0]) for _ in range(3)]
        assert _started(live, held) == [200] * 3
        assert live.chat(KEYS[0]).answer() == 429
        held[0].conn.close()
        assert held[0].response is not None
        held[0].response.close()
        for _ in range(200):  # the server notices the closed socket on its next keep-alive write
            retry = live.chat(KEYS[0])
            if retry.answer() == 200:
                break
            assert retry.status == 429
            threading.Event().wait(0.05)
        else:
            pytest.fail("the disconnected stream never gave its ticket back")


# -- configuration ---------------------------------------------------------------------------


def test_default_bounds_leave_a_reserve_below_the_thread_count() -> None:
    limits = gate_limits(ServerLimits())
    assert ServerLimits().threads == 32
    assert (limits.host, limits.per_key, limits.queue_bound) == (24, 12, 12)
    assert gate_limits(ServerLimits(threads=8)).host == 6
    assert gate_limits(ServerLimits(threads=3)).host == 1
    explicit = gate_limits(ServerLimits(threads=8, inference_max=7, inference_per_key=9))
    assert (explicit.host, explicit.per_key) == (7, 7)


@pytest.mark.parametrize("limits", [ServerLimits(threads=2), ServerLimits(threads=8, inference_max=8)])
def test_a_host_wide_bound_not_below_the_threads_is_refused(limits: ServerLimits, home: Path) -> None:
    with pytest.raises(ValueError, match="below the thread count"):
        gate_limits(limits)


def test_serve_refuses_a_config_without_inference_room(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("werk_host.logs.configure_logging", lambda level, secrets: None)
    assert main(["serve", "--home", str(home), "--threads", "2", "--port", "0"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("werk: ") and "below the thread count" in lines[0], lines
    assert lines[0].endswith("(raise --threads or lower --inference-max)")


def test_serve_options_reach_the_limits() -> None:
    from werk_host.cli.commands import build_parser

    args = build_parser().parse_args(
        ["serve", "--inference-max", "5", "--inference-per-key", "2", "--inference-queue", "0"]
        + ["--inference-wait", "1.5", "--inference-slots", "3"]
    )
    assert (args.inference_max, args.inference_per_key, args.inference_queue) == (5, 2, 0)
    assert (args.inference_wait, args.inference_slots) == (1.5, 3)


def test_tickets_release_once() -> None:
    """A second release frees nothing more: the bounds hold exactly afterwards."""
    gate = InferenceGate(GateLimits(host=2, per_key=2, queue=0))
    ticket = gate.enter("p")
    ticket.seat("i", 1)
    ticket.release()
    ticket.release()
    first, second = gate.enter("p"), gate.enter("p")
    with pytest.raises(WerkError) as refused:
        gate.enter("p")
    assert refused.value.code is ErrorCode.RESOURCE_EXHAUSTED and refused.value.details[RETRY_AFTER] >= 1
    first.seat("i", 1)
    with pytest.raises(WerkError) as busy:
        second.seat("i", 1)  # capacity 1, no queue: one seat, not two
    assert busy.value.code is ErrorCode.UNAVAILABLE and busy.value.retryable

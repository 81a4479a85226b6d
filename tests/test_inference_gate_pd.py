"""Prefill and decode run inside the inference gate (docs/operations.md, "Inference concurrency").

Real sockets against a real waitress server with 8 threads, so the host-wide bound is 6 and the
per-key bound 3. The reference adapter, subclassed, holds every prefill of a text starting
``HOLD`` (and, once asked, every decode) inside the backend until the test releases it, so the
test decides how many operations are running. Every socket read has a timeout and a held
operation ends by itself after :data:`HOLD_S`, so a regression fails in bounded time instead of
hanging.
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
from werk_host.config import ServerLimits
from werk_host.plugin import hookimpl
from werk_host.seam import DecodeOutput, DecodeWork, PrefilledState, PrefillWork
from werk_host.testing.hosts import MODEL, make_host, running
from werk_host.testing.reference import PLUGIN_NAME, MemoryAdapter, MemoryBackendPlugin

KEYS = ("sk-gate-pd-key-one-001", "sk-gate-pd-key-two-002", "sk-gate-pd-key-three-03", "sk-gate-pd-key-four-004")
#: The longest a held operation stays in the backend if a test never releases it.
HOLD_S = 60.0
HOST_BOUND, PER_KEY = 6, 3  # of ServerLimits(threads=8): 8 - max(2, 8 // 4), half of that


class HeldAdapter(MemoryAdapter):
    """The reference adapter whose held operations wait inside the backend for the plugin's
    :attr:`HeldPlugin.release` (module docstring)."""

    def _hold(self) -> None:
        plugin = self.plugin
        assert isinstance(plugin, HeldPlugin)
        with plugin.inside:
            plugin.open += 1
            plugin.inside.notify_all()
        try:
            plugin.release.wait(HOLD_S)
        finally:
            with plugin.inside:
                plugin.open -= 1

    @hookimpl(specname="werk_prefill")
    def prefill(self, work: PrefillWork) -> PrefilledState:
        if str(getattr(work.input, "text", "")).startswith("HOLD"):
            self._hold()
        return super().prefill(work)

    @hookimpl(specname="werk_decode")
    def decode(self, work: DecodeWork) -> DecodeOutput:
        plugin = self.plugin
        assert isinstance(plugin, HeldPlugin)
        if plugin.hold_decodes:
            self._hold()
        return super().decode(work)


class HeldPlugin(MemoryBackendPlugin):
    adapter_class = HeldAdapter

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.inside = threading.Condition()
        self.open = 0
        self.hold_decodes = False

    def wait_inside(self, count: int) -> None:
        """Until ``count`` operations are held in the backend (a bounded wait)."""
        with self.inside:
            assert self.inside.wait_for(lambda: self.open >= count, TIMEOUT_S), (self.open, count)


@dataclass
class Call:
    """One request sent on its own connection, answered on demand."""

    conn: http.client.HTTPConnection
    status: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    body: Any = None

    def answer(self) -> int | None:
        """The status (``None``: no answer within :data:`TIMEOUT_S`)."""
        if self.status is None:
            try:
                response = self.conn.getresponse()
            except TimeoutError:
                return None
            self.status = response.status
            self.headers = {k.lower(): v for k, v in response.getheaders()}
            self.body = json.loads(response.read())
        return self.status


@dataclass
class Live:
    plugin: HeldPlugin
    port: int
    opened: list[Call] = field(default_factory=list)

    def post(self, path: str, body: dict[str, Any], key: str) -> Call:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=TIMEOUT_S)
        headers = {
            "Authorization": f"Bearer {key}",
            "Content-Type": "application/json",
            "X-Werk-Protocol-Version": "1.0",
        }
        conn.request("POST", path, body=json.dumps(body).encode(), headers=headers)
        call = Call(conn)
        self.opened.append(call)
        return call

    def prefill(self, key: str, text: str = "HOLD the quick brown fox") -> Call:
        body = {
            "model_id": MODEL,
            "input": {"type": "text", "text": text},
            "policy": {"mode": "ephemeral", "reuse": "disabled"},
            "allow_experimental": True,
        }
        return self.post("/werk/v1/prefill", body, key)

    def decode(self, key: str, handoff: str) -> Call:
        return self.post("/werk/v1/decode", {"handoff": handoff, "max_tokens": 4, "allow_experimental": True}, key)

    def handoff(self, key: str) -> str:
        """A fresh handoff of ``key`` from a prefill that is not held."""
        call = self.prefill(key, "the quick brown fox")
        assert call.answer() == 200, call.body
        handoff = call.body["data"]["handoff"]
        assert isinstance(handoff, str)
        return handoff


@contextmanager
def live_host(home: Path, slots: int = HOST_BOUND) -> Iterator[Live]:
    """A served host around a :class:`HeldPlugin`; ``slots``: the prefill/decode seats of its
    instance (default: all of the host-wide bound, so that only the bounds tested decide)."""
    plugin = HeldPlugin()
    limits = ServerLimits(threads=8, inference_slots=slots)
    host = make_host(home, api_keys=KEYS, plugin=plugin, plugin_name=PLUGIN_NAME, limits=limits)
    with running(host) as url:
        live = Live(plugin, int(url.rsplit(":", 1)[1]))
        try:
            yield live
        finally:
            plugin.release.set()
            for call in live.opened:
                call.conn.close()


def _refused(call: Call, status: int, code: str) -> None:
    """``call`` was refused in the Werk error shape, retryable, with ``Retry-After``."""
    assert call.answer() == status, call.body
    assert int(call.headers["retry-after"]) >= 1
    error = call.body["error"]
    assert (error["code"], error["retryable"]) == (code, True), error


def _finish(live: Live, calls: list[Call]) -> list[int | None]:
    live.plugin.release.set()
    return [call.answer() for call in calls]


@pytest.mark.parametrize("operation", ["prefill", "decode"])
def test_held_operations_leave_control_routes_answering(home: Path, operation: str) -> None:
    """12 held prefills (or decodes) from four keys on an 8-thread server: six run, the other
    six are refused at once (503 ``unavailable``, ``Retry-After``), and every control route
    answers every key meanwhile. Ungated, the operations take all 8 threads and the control
    routes time out."""
    with live_host(home) as live:
        if operation == "prefill":
            calls = [live.prefill(KEYS[i % len(KEYS)]) for i in range(12)]
        else:
            handoffs = [(KEYS[i % len(KEYS)], live.handoff(KEYS[i % len(KEYS)])) for i in range(12)]
            live.plugin.hold_decodes = True
            calls = [live.decode(key, handoff) for key, handoff in handoffs]
        live.plugin.wait_inside(HOST_BOUND)
        control_routes_answer(live.port, KEYS, "prefills/decodes")
        assert live.plugin.open == HOST_BOUND
        statuses = _finish(live, calls)
        assert sorted(statuses, key=str) == [200] * HOST_BOUND + [503] * (12 - HOST_BOUND), statuses
        for call in calls:
            if call.status == 503:
                _refused(call, 503, "unavailable")


def test_one_key_over_its_bound_is_refused_while_another_key_gets_through(home: Path) -> None:
    """Key one holds its three tickets (two prefills, one decode): its next prefill and decode
    are 429 ``resource_exhausted`` with ``Retry-After``, and the refused decode's handoff is
    not consumed (it decodes once the key has room); key two still prefills and decodes."""
    with live_host(home) as live:
        one, two = KEYS[0], KEYS[1]
        held_handoff, spare, theirs = live.handoff(one), live.handoff(one), live.handoff(two)
        live.plugin.hold_decodes = True
        held = [live.prefill(one), live.prefill(one), live.decode(one, held_handoff)]
        live.plugin.wait_inside(PER_KEY)
        _refused(live.prefill(one), 429, "resource_exhausted")
        _refused(live.decode(one, spare), 429, "resource_exhausted")
        live.plugin.hold_decodes = False
        other = live.prefill(two, "not held")
        assert other.answer() == 200, other.body
        decoded = live.decode(two, theirs)
        assert decoded.answer() == 200, decoded.body
        assert _finish(live, held) == [200] * PER_KEY
        again = live.decode(one, spare)
        assert again.answer() == 200, again.body


def test_failed_operations_give_their_tickets_back(home: Path) -> None:
    """Failing prefills (the backend raises a typed error, or crashes) and failing decodes (an
    unknown handoff), more of them than the per-key bound, each release their ticket: the key
    then still seats exactly its three held prefills, and only the fourth is refused."""
    with live_host(home) as live:
        key = KEYS[0]
        for _ in range(PER_KEY + 1):
            failed = live.prefill(key, "FAIL here")
            assert failed.answer() == 500, failed.body
            unknown = live.decode(key, "wh_" + "x" * 43)
            assert unknown.answer() == 410, unknown.body
        live.plugin.adapters[-1].fail.add("crash:prefill")
        for _ in range(PER_KEY + 1):
            crashed = live.prefill(key, "the quick brown fox")
            assert crashed.answer() == 500, crashed.body
        live.plugin.adapters[-1].fail.discard("crash:prefill")
        held = [live.prefill(key) for _ in range(PER_KEY)]
        live.plugin.wait_inside(PER_KEY)
        _refused(live.prefill(key), 429, "resource_exhausted")
        assert _finish(live, held) == [200] * PER_KEY


def test_prefills_queue_for_their_own_seats_and_leave_the_chat_seat_free(home: Path) -> None:
    """With one prefill/decode seat: a held prefill runs, the next two wait in the instance's
    queue, and a chat still gets the instance's one chat seat (the reference backend reports
    one) meanwhile instead of queueing behind them; released, the queued prefills run in turn."""
    with live_host(home, slots=1) as live:
        running_ = live.prefill(KEYS[0])
        live.plugin.wait_inside(1)
        queued = [live.prefill(KEYS[1]), live.prefill(KEYS[2])]
        hello = {"role": "user", "content": "hello there"}
        chat = live.post("/v1/chat/completions", {"model": MODEL, "max_tokens": 4, "messages": [hello]}, KEYS[3])
        assert chat.answer() == 200, chat.body
        assert live.plugin.open == 1
        assert _finish(live, [running_, *queued]) == [200] * 3

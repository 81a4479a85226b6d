"""State-slot isolation and token integrity on a real llama-server behind a real Werk host.

Ordinary ``/v1`` traffic (with or without a client-chosen slot) never reaches the state slot
while Werk prefills and saves, or restores and decodes, there; a saved or restored state holds
exactly the tokens it claims (docs/architecture.md, "llama.cpp slot use"; docs/states.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from werk_llamacpp.adapter import LlamaCppAdapter
from werk_llamacpp.integrity import SEQ_MAGIC, slot_file_tokens, tokens_digest
from werk_llamacpp.slots import SlotRouter, held_for_life, strip_slot_fields
from werk_llamacpp.snapshot import SlotImage, read_image, verify_tokens

from werk_host.plugin import (
    BackendBounds,
    ErrorCode,
    HostConfig,
    InferenceResponse,
    ModelManifest,
    WerkError,
    checksum_text,
)
from werk_host.testing.api import Api
from werk_host.testing.host import Host, ModelRegistry, build_host
from werk_host.testing.hosts import running

KEY_A = "sk-werk-isolation-a-123456"
KEY_B = "sk-werk-isolation-b-654321"
#: Where the token ids start in a slot file: its header (3 words), the packed token state's
#: marker, version and count (3 words); see test_slot_file_header_lists_the_prefilled_tokens.
TOKENS_AT = 24
#: Bound on each racing phase (prefills, reuse): the test never runs much longer than this.
PHASE_S = 45.0


@dataclass
class Env:
    host: Host
    a: Api
    b: Api

    @property
    def adapter(self) -> LlamaCppAdapter:
        adapter = self.host.fleet.adapter
        assert isinstance(adapter, LlamaCppAdapter)
        return adapter

    def prefill(self, text: str, **extra: Any) -> tuple[int, dict[str, Any]]:
        body = {"model_id": "tiny", "input": {"type": "text", "text": text}, "allow_experimental": True, **extra}
        return self.a.post("/werk/v1/prefill", body)

    def decode(self, handoff: str) -> tuple[int, dict[str, Any]]:
        return self.a.post("/werk/v1/decode", {"handoff": handoff, "allow_experimental": True, "max_tokens": 4})

    def tokens(self, text: str) -> list[int]:
        proc = self.adapter.current()
        assert proc is not None and proc.client is not None
        return proc.client.tokenize(text, add_special=True, parse_special=False)

    def payload(self, state_id: str) -> Path:
        (path,) = self.host.config.home.glob(f"runtime-state/v1/p_*/{state_id}/payload.bin")
        return path


def make_env(
    tmp_path: Path, binary: Path, model: Path, parallel: int, bounds: BackendBounds | None = None
) -> Iterator[Env]:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    ModelRegistry(home).add(
        ModelManifest.from_paths("tiny", [model], backend="llama.cpp", params={"max_output_tokens": 256})
    )
    config = HostConfig(
        home=home,
        api_keys=(KEY_A, KEY_B),
        model="tiny",
        backend_options={"llamacpp": {"llama_server": str(binary), "parallel": parallel, "ctx": 1024 * parallel}},
        backend_bounds=bounds or BackendBounds(),
    )
    host = build_host(config)
    with running(host) as base:
        yield Env(host, Api(base, KEY_A, timeout=30), Api(base, KEY_B, timeout=30))


@pytest.fixture
def env(tmp_path: Path, llama_server_path: Path, tiny_model: Path) -> Iterator[Env]:
    """Three slots: two ordinary ones and the state slot (2)."""
    yield from make_env(tmp_path, llama_server_path, tiny_model, parallel=3)


def text_of(owner: str, n: int) -> str:
    """A distinct prompt of about 111 tokens."""
    return f"{owner} {n}: " + " ".join(f"{owner.lower()}{n}x{j}" for j in range(30))


def ok(result: tuple[int, dict[str, Any]]) -> dict[str, Any]:
    status, body = result
    assert status == 200, body
    data: dict[str, Any] = body["data"]
    return data


class TrafficB:
    """Key B's ``/v1/completions`` loops (threads), some naming the state slot themselves."""

    def __init__(self, env: Env, threads: int, state_slot: int) -> None:
        self.env = env
        self.stop = threading.Event()
        self.statuses: list[int] = []
        self.errors: list[str] = []
        self.threads = [threading.Thread(target=self.loop, args=(i, state_slot)) for i in range(threads)]

    def loop(self, i: int, state_slot: int) -> None:
        n = 0
        while not self.stop.is_set():
            # as long as A's prompts: a token count alone cannot tell B's KV from A's
            body: dict[str, Any] = {"model": "tiny", "prompt": text_of("B", (n + 20 * i) % 40), "max_tokens": 4}
            if n % 3 == 1:
                body["id_slot"] = state_slot  # the client asks for Werk's slot: never honoured
            elif n % 3 == 2:
                body["slot_id"] = state_slot
            n += 1
            try:
                status, answer = self.env.b.post("/v1/completions", body)
            except OSError as err:
                self.errors.append(repr(err))
                continue
            self.statuses.append(status)
            if status >= 500:
                self.errors.append(json.dumps(answer)[:300])

    def __enter__(self) -> TrafficB:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)


@pytest.mark.llamaserver
def test_v1_traffic_never_reaches_a_state_being_prefilled_saved_or_decoded(env: Env) -> None:
    ok(env.prefill(text_of("A", -1)))  # the probe, before the race
    state_slot = env.adapter.state_slot
    assert state_slot == 2
    prefills: list[tuple[str, dict[str, Any]]] = []
    failures: list[str] = []
    with TrafficB(env, threads=2, state_slot=state_slot) as traffic:
        deadline = time.monotonic() + PHASE_S
        n = 0
        while n < 100 and time.monotonic() < deadline:
            text = text_of("A", n)
            status, body = env.prefill(text)
            if status == 200:
                prefills.append((text, body["data"]))
            else:
                failures.append(f"{status} {json.dumps(body)[:300]}")
            n += 1
        assert n >= 10, "too few prefills ran within the bound"
        # restore → decode with the same traffic: every committed state is reused as it is
        reused = 0
        for text, data in prefills[:8]:
            if time.monotonic() > deadline + PHASE_S:
                break
            again = ok(env.prefill(text, policy={"reuse": "required"}))
            assert again["reused"] is True and again["state_id"] == data["state_id"]
            out = ok(env.decode(again["handoff"]))
            assert 0 < out["completion_tokens"] <= 4
            reused += 1
        assert reused >= 3
    assert failures == []  # no 500 (nor any other failure) for A
    assert traffic.errors == [] and traffic.statuses and set(traffic.statuses) == {200}

    foreign = 0
    for text, data in prefills:
        path = env.payload(data["state_id"])
        fd = os.open(path, os.O_RDONLY)
        try:
            image = read_image(fd, os.fstat(fd).st_size)
            held = slot_file_tokens(fd, image.n_written)
        finally:
            os.close(fd)
        expected = env.tokens(text)
        assert image.tokens == expected
        foreign += sum(1 for t in held if t not in expected) + abs(len(held) - len(expected))
        assert held == expected  # the slot file holds A's prompt, exactly
    assert foreign == 0
    assert all(s["reusable"] for s in ok(env.a.get("/werk/v1/states"))["states"])


@pytest.mark.llamaserver
def test_slot_file_header_lists_the_prefilled_tokens(env: Env) -> None:
    """The slot file format the token check relies on, read from a real save."""
    text = text_of("A", 7)
    data = ok(env.prefill(text))
    raw = env.payload(data["state_id"]).read_bytes()
    magic, _version, count = struct.unpack_from("<III", raw)
    assert magic == SEQ_MAGIC
    expected = env.tokens(text)
    # llama-server's packed token state: marker, version, the token ids, no media
    assert list(struct.unpack_from(f"<{count}i", raw, 12)) == [-1, 1, len(expected), *expected, 0]
    fd = os.open(env.payload(data["state_id"]), os.O_RDONLY)
    try:
        image = read_image(fd, len(raw))
        verify_tokens(fd, image, env.adapter.token_key)  # the trailer's digest verifies
        other = SlotImage(image.tokens, image.n_saved, image.n_written, tokens_digest(b"k" * 32, image.tokens))
        with pytest.raises(WerkError) as err:
            verify_tokens(fd, other, env.adapter.token_key)
        assert err.value.code is ErrorCode.CORRUPT_STATE
    finally:
        os.close(fd)


def _reseal(path: Path, payload: bytes) -> None:
    """Replace a stored payload and its metadata's size, SHA-256 and checksum (the store accepts it)."""
    state = path.parent
    path.write_bytes(payload)
    meta = json.loads((state / "metadata.json").read_bytes())
    meta["bytes"] = len(payload)
    meta["payload_sha256"] = hashlib.sha256(payload).hexdigest()
    data = json.dumps(meta, sort_keys=True, separators=(",", ":"), allow_nan=False).encode("ascii")
    (state / "metadata.json").write_bytes(data)
    (state / "metadata.sha256").write_bytes(checksum_text(data))


@pytest.mark.llamaserver
@pytest.mark.parametrize("forgery", ["slot_file_only", "slot_file_and_trailer"])
def test_a_state_holding_other_tokens_than_it_claims_is_never_restored(env: Env, forgery: str) -> None:
    """Other token ids in the slot file (and, without the key, in the trailer too): the store's
    checksums are resealed and llama-server's counts still agree, so only the token check can
    tell. It refuses the state as corrupt and quarantines it."""
    text = text_of("A", 1)
    first = ok(env.prefill(text))
    ok(env.decode(first["handoff"]))  # the slot moves on: the next decode restores from the store
    path = env.payload(first["state_id"])
    raw = path.read_bytes()
    fd = os.open(path, os.O_RDONLY)
    try:
        image = read_image(fd, len(raw))
    finally:
        os.close(fd)
    forged = list(reversed(image.tokens))
    assert forged != image.tokens
    slot = bytearray(raw[: image.n_written])
    struct.pack_into(f"<{len(forged)}i", slot, TOKENS_AT, *forged)
    claimed = (
        image if forgery == "slot_file_only" else SlotImage(forged, image.n_saved, image.n_written, image.tokens_hmac)
    )
    _reseal(path, bytes(slot) + claimed.trailer())
    again = ok(env.prefill(text, policy={"reuse": "required"}))  # intact by its checksum
    status, body = env.decode(again["handoff"])
    assert (status, body["error"]["code"]) == (500, "corrupt_state"), body
    assert first["state_id"] not in {s["id"] for s in ok(env.a.get("/werk/v1/states"))["states"]}
    status, body = env.prefill(text, policy={"reuse": "required"})
    assert (status, body["error"]["code"]) == (409, "conflict"), body  # quarantined, never offered again


@pytest.mark.llamaserver
def test_prefill_and_decode_on_a_stopped_child_are_retryable_unavailable(env: Env) -> None:
    data = ok(env.prefill(text_of("A", 2)))
    proc = env.adapter.current()
    assert proc is not None and proc.pid is not None
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        for status, body in (env.prefill(text_of("A", 3)), env.decode(data["handoff"])):
            assert (status, body["error"]["code"]) == (503, "unavailable"), body
            assert body["error"]["retryable"] is True
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    again = ok(env.prefill(text_of("A", 3)))
    assert again["state_id"] is not None
    assert env.adapter.current() is proc  # the same child: stopped is not dead


@pytest.mark.llamaserver
def test_v1_right_after_the_child_is_killed_waits_for_the_restart(env: Env) -> None:
    body = {"model": "tiny", "prompt": text_of("B", 1), "max_tokens": 2}
    assert env.b.post("/v1/completions", body)[0] == 200
    for trial in range(8):
        proc = env.adapter.current()
        assert proc is not None and proc.pid is not None, f"trial {trial}: no child was restarted"
        os.kill(proc.pid, signal.SIGKILL)
        status, answer = env.b.post("/v1/completions", body)  # no pause: the death may not be seen yet
        assert status == 200, (trial, answer)
        assert env.adapter.current() is not proc


#: One short request per compat route, each of its own API's shape (issue 48, item 3).
ROUTES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    "/v1/completions": {"model": "tiny", "prompt": "hi there", "max_tokens": 2},
    "/v1/messages": {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    "/v1/responses": {"model": "tiny", "input": "hi", "max_output_tokens": 2},
    "/api/chat": {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": False,
        "options": {"num_predict": 2},
    },
    "/api/generate": {"model": "tiny", "prompt": "hi", "stream": False, "options": {"num_predict": 2}},
}


@pytest.fixture
def one_slot(tmp_path: Path, llama_server_path: Path, tiny_model: Path) -> Iterator[Env]:
    """One ordinary slot (and the state slot): every request of the other key finds it foreign."""
    yield from make_env(tmp_path, llama_server_path, tiny_model, parallel=2)


@pytest.mark.llamaserver
def test_another_keys_request_right_after_the_child_is_killed_waits_for_the_restart(one_slot: Env) -> None:
    """Key A's request leaves its tokens in the only ordinary slot; the child is killed; key B's
    next request, on each compat route in turn, must erase that slot first. The erase finds the
    child dead and restarts it, as the ordinary path does: 0 failures in 15 trials."""
    env = one_slot
    failures = []
    for trial in range(15):
        route = list(ROUTES)[trial % len(ROUTES)]
        assert env.a.post("/v1/completions", {**ROUTES["/v1/completions"], "prompt": text_of("A", trial)})[0] == 200
        proc = env.adapter.current()
        assert proc is not None and proc.pid is not None, f"trial {trial}: no child was restarted"
        os.kill(proc.pid, signal.SIGKILL)
        status, answer = env.b.post(route, ROUTES[route])  # no pause: the death may not be seen yet
        if status != 200:
            failures.append((trial, route, status, answer))
        assert env.adapter.current() is not proc
    assert failures == []


#: Short bounds on calls to the child, so a stopped child costs the test seconds.
SHORT = BackendBounds(call_s=2.0, first_byte_s=2.0, idle_s=2.0)


@pytest.mark.llamaserver
@pytest.mark.parametrize("route", ["/v1/chat/completions", "/api/chat"])
def test_a_stopped_child_ends_another_keys_request_within_its_bound(
    tmp_path: Path, llama_server_path: Path, tiny_model: Path, route: str
) -> None:
    """Issue 48, item 3 (the hang): with the child stopped (alive, silent), key B's request
    must first read the prompt's tokens and erase A's slot; each call is bounded by
    ``--backend-timeout`` and the first one that runs out ends the request (503, retryable),
    instead of each of them waiting out the native client's own 120 s (issue 48, item 2: a
    backend that could not count is never answered with a 4xx on the estimate)."""
    served = make_env(tmp_path, llama_server_path, tiny_model, parallel=2, bounds=SHORT)
    env = next(served)
    different = {**ROUTES[route], "messages": [{"role": "user", "content": "something else"}]}
    # the estimate (a token per 3 bytes) exceeds the 2,048-token context; only the child could
    # count it exactly, and it cannot: the answer says the backend is down, never "too long"
    long = {**ROUTES[route], "messages": [{"role": "user", "content": "word " * 2000}]}
    assert env.a.post(route, ROUTES[route])[0] == 200
    proc = env.adapter.current()
    assert proc is not None and proc.pid is not None
    slow = Api(env.b.base, KEY_B, timeout=200)
    os.kill(proc.pid, signal.SIGSTOP)
    began = time.monotonic()
    try:
        for body in (ROUTES[route], different, long):  # the count known already, then new ones
            status, answer = slow.post(route, body)
            assert status == 503, answer
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    assert time.monotonic() - began < 60  # 2 s bounds: far under one 120 s wait
    assert env.b.post(route, ROUTES[route])[0] == 200  # the same child answers again
    assert env.adapter.current() is proc
    served.close()


def test_router_hands_each_ordinary_slot_to_one_request_and_never_the_state_slot() -> None:
    lock = threading.Lock()
    router = SlotRouter(lock, wait_s=0.05)
    first, second = router.acquire(3), router.acquire(3)
    assert {first.slot, second.slot} == {0, 1} and router.held() == {0, 1}
    with pytest.raises(WerkError) as err:
        router.acquire(3)  # the state slot (2) is never handed out: wait, bounded, then refuse
    assert err.value.code is ErrorCode.UNAVAILABLE and err.value.retryable is True
    first.release()
    first.release()  # idempotent
    third = router.acquire(3)
    assert third.slot == first.slot and not lock.locked()
    second.release()
    third.release()
    assert router.held() == set()


def test_router_serializes_a_one_slot_child_with_state_work() -> None:
    lock = threading.Lock()
    router = SlotRouter(lock, wait_s=0.05)
    lease = router.acquire(1)
    assert lease.slot == 0 and lease.shared and lock.locked()  # state work waits for it
    with pytest.raises(WerkError):
        router.acquire(1)
    lease.release()
    assert not lock.locked()
    with lock, pytest.raises(WerkError):  # state work running: the ordinary request waits, bounded
        router.acquire(1)


def test_a_relayed_response_holds_its_slot_until_closed_or_read_to_the_end() -> None:
    router = SlotRouter(threading.Lock(), wait_s=0.05)
    closed: list[bool] = []
    lease = router.acquire(2)
    response = held_for_life(InferenceResponse(200, {}, iter([b"a", b"b"]), lambda: closed.append(True)), lease)
    assert router.held() == {0}
    assert b"".join(response.body) == b"ab" and router.held() == set()  # read to the end
    response.close()
    assert closed == [True]
    lease = router.acquire(2)
    response = held_for_life(InferenceResponse(200, {}, iter([b"a", b"b"]), lambda: None), lease)
    next(response.body)
    response.close()  # a client that leaves early
    assert router.held() == set()


def test_client_slot_fields_are_dropped() -> None:
    assert strip_slot_fields({"id_slot": 2, "slot_id": 2, "prompt": "x"}) == {"prompt": "x"}

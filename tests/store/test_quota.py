"""Storage bounds (docs/states.md, "Quotas"): per key and store-wide, in states and in bytes.

Real stores on real files; the service test drives a real server with the reference backend
and two API keys.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from werk_host.config import StoreBounds
from werk_host.errors import ErrorCode, WerkError
from werk_host.store import StateStore
from werk_host.store.quota import footprint
from werk_host.store.records import decode_metadata
from werk_host.testing.api import Api
from werk_host.testing.hosts import backend_host, running

from .helpers import ENV, P1, P2, FakeClock, commit, read_payload

P3 = "c3" * 16


def refused(fn: Callable[[], object]) -> WerkError:
    with pytest.raises(WerkError) as info:
        fn()
    err = info.value
    assert err.code is ErrorCode.RESOURCE_EXHAUSTED
    assert err.retryable
    return err


def leftovers(root: Path) -> list[str]:
    """Staging and temporary entries anywhere in the catalog (a refused commit leaves none)."""
    return sorted(p.name for p in root.rglob("*") if p.name.startswith((".staging-", ".tmp-")))


def commit_stream(store: StateStore, principal: str, chunks: Iterator[bytes]) -> object:
    return store.commit(principal, model_id="m", backend="b", compat_key=ENV, payload=chunks)


def state_bytes(root: Path, principal: str, state_id: str) -> int:
    """A committed state's footprint, from its files on disk: payload + metadata + checksum."""
    d = root / f"p_{principal}" / state_id
    meta = decode_metadata(
        (d / "metadata.json").read_bytes(),
        (d / "metadata.sha256").read_bytes(),
        expected_id=state_id,
        expected_principal=principal,
    )
    assert meta is not None
    return footprint(meta)


def test_a_key_at_its_state_bound_is_refused_while_another_key_commits(
    make_store: Callable[..., StateStore], root: Path
) -> None:
    store = make_store(max_states_per_key=3)
    kept = [commit(store, P1, f"a{i}".encode()) for i in range(3)]
    err = refused(lambda: commit(store, P1, b"one too many"))
    assert "3 states" in err.message and "delete or prune" in err.message
    assert commit(store, P2, b"b0").id  # another key is not affected
    assert leftovers(root) == []
    assert sorted(r.id for r in store.list_states(P1)[0]) == sorted(r.id for r in kept)
    assert store.delete(P1, kept[0].id)  # deleting makes room again
    assert commit(store, P1, b"a3").id
    refused(lambda: commit(store, P1, b"full again"))


def test_a_key_at_its_byte_bound_is_refused_while_another_key_commits(
    make_store: Callable[..., StateStore], root: Path
) -> None:
    probe = make_store()
    first = commit(probe, P3, b"x" * 4000)
    per_state = state_bytes(root, P3, first.id)
    assert per_state > 4000  # payload plus metadata
    store = make_store(max_bytes_per_key=2 * per_state)
    commit(store, P1, b"y" * 4000)
    commit(store, P1, b"z" * 4000)  # exactly at the bound
    refused(lambda: commit(store, P1, b"w"))  # one more byte: over it
    refused(lambda: commit_stream(store, P1, iter([b"v" * 3000, b"v" * 3000])))  # a streamed payload
    assert commit(store, P2, b"q" * 4000).id
    assert leftovers(root) == []
    assert len(store.list_states(P1)[0]) == 2


def test_a_payload_streaming_past_the_room_left_stops_before_it_is_all_written(
    make_store: Callable[..., StateStore], root: Path
) -> None:
    store = make_store(max_bytes_per_key=10_000)
    pulled: list[int] = []

    def chunks() -> Iterator[bytes]:
        for i in range(100):
            pulled.append(i)
            yield b"p" * 1000

    refused(lambda: commit_stream(store, P1, chunks()))
    assert len(pulled) < 100  # refused while streaming, not after staging the whole payload
    assert leftovers(root) == []


def test_the_store_wide_bounds_hold_across_keys(make_store: Callable[..., StateStore], root: Path) -> None:
    store = make_store(max_states=4, max_states_per_key=3)
    for i in range(3):
        commit(store, P1, f"a{i}".encode())
    commit(store, P2, b"b0")
    err = refused(lambda: commit(store, P2, b"b1"))
    assert "the runtime-state store" in err.message
    refused(lambda: commit(store, P3, b"c0"))


def test_per_key_bounds_default_to_a_quarter_of_the_store_wide_ones(make_store: Callable[..., StateStore]) -> None:
    store = make_store(max_states=8)
    for i in range(2):
        commit(store, P1, f"a{i}".encode())
    refused(lambda: commit(store, P1, b"a2"))
    commit(store, P2, b"b0")


def test_usage_follows_the_disk_across_instances_and_restarts(
    make_store: Callable[..., StateStore], root: Path
) -> None:
    a = make_store(max_states_per_key=3)
    b = make_store(max_states_per_key=3)  # another process would see the same files
    commit(a, P1, b"a0")
    commit(a, P1, b"a1")
    last = commit(b, P1, b"b0")
    refused(lambda: commit(a, P1, b"a2"))  # ``a`` counts the state ``b`` committed
    restarted = make_store(max_states_per_key=3)
    refused(lambda: commit(restarted, P1, b"after restart"))
    assert b.delete(P1, last.id)
    assert commit(a, P1, b"a2").id  # and the one ``b`` deleted


def test_expired_states_make_room(make_store: Callable[..., StateStore], clock: FakeClock) -> None:
    store = make_store(max_states_per_key=2)
    commit(store, P1, b"a0", ttl_seconds=10)
    commit(store, P1, b"a1")
    refused(lambda: commit(store, P1, b"a2"))
    clock.advance(11)
    assert commit(store, P1, b"a2").id


def test_racing_commits_of_one_key_never_exceed_its_bound(make_store: Callable[..., StateStore], root: Path) -> None:
    """Every commit passes the first check (the key holds nothing yet) and streams at once; the
    check under the lock right before publishing admits exactly the bound."""
    store = make_store(max_states_per_key=3)
    n = 8
    streaming = threading.Barrier(n, timeout=30)
    outcomes: list[str] = []
    lock = threading.Lock()

    def payload(i: int) -> Iterator[bytes]:
        streaming.wait()  # all n are past the first check before any publishes
        yield f"state {i}".encode()

    def run(i: int) -> None:
        try:
            commit_stream(store, P1, payload(i))
            outcome = "ok"
        except WerkError as exc:
            outcome = exc.code.value
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(outcomes) == ["ok"] * 3 + ["resource_exhausted"] * 5
    states = store.list_states(P1)[0]
    assert len(states) == 3
    assert all(read_payload(store, P1, s.id).startswith(b"state ") for s in states)
    assert leftovers(root) == []


def test_invalid_bounds_are_refused(root: Path) -> None:
    for bad in ({"max_states": 0}, {"max_bytes_per_key": 0}, {"max_states_per_key": -1}):
        with pytest.raises(ValueError):
            StateStore(root, **bad)  # type: ignore[arg-type]


# -- the service: two keys on a real server -------------------------------------------------

KEY_A = "sk-werk-quota-a-0123456789"
KEY_B = "sk-werk-quota-b-0123456789"


def prefill(api: Api, text: str) -> tuple[int, dict[str, object]]:
    return api.post(
        "/werk/v1/prefill",
        {"model_id": "tiny", "input": {"type": "text", "text": text}, "allow_experimental": True},
    )


def test_a_key_over_its_quota_gets_429_while_another_key_still_commits(tmp_path: Path) -> None:
    host, plugin = backend_host(
        tmp_path / "home", api_keys=(KEY_A, KEY_B), store_bounds=StoreBounds(max_states_per_key=2)
    )
    with running(host) as base:
        a, b = Api(base, KEY_A), Api(base, KEY_B)
        for i in range(2):
            status, body = prefill(a, f"a {i}")
            assert status == 200, body
            assert body["data"]["state_id"]  # type: ignore[index]
        (adapter,) = plugin.adapters
        prefills = adapter.calls.count("prefill")
        status, body = prefill(a, "a 2")
        assert status == 429, body
        error = body["error"]
        assert isinstance(error, dict)
        assert error["code"] == "resource_exhausted" and error["retryable"] is True
        assert "this key already stores 2 states" in error["message"]
        assert KEY_A not in str(body) and str(tmp_path) not in str(body)
        assert adapter.calls.count("prefill") == prefills  # refused before any backend work
        status, body = prefill(a, "a 0")  # reusing a stored state commits nothing: still served
        assert status == 200 and body["data"]["reused"] is True, body  # type: ignore[index]
        status, body = prefill(b, "b 0")
        assert status == 200, body
        status, listed = a.get("/werk/v1/states")
        assert status == 200 and len(listed["data"]["states"]) == 2


def test_a_key_whose_states_expired_is_admitted_again(tmp_path: Path) -> None:
    """The early refusal reconciles first, as a commit does: expired states do not hold the bound."""
    clock = FakeClock()
    store = StateStore(tmp_path / "home" / "runtime-state" / "v1", clock=clock, max_states_per_key=1)
    commit(store, P1, b"a0", ttl_seconds=5)
    refused(lambda: store.admit(P1))
    store.admit(P2)  # another key, and a key with no directory yet, are admitted
    clock.advance(6)
    store.admit(P1)
    assert commit(store, P1, b"a1").id


def test_serve_options_reach_the_store_bounds(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import werk_host.server
    from werk_host.cli.commands import build_parser
    from werk_host.config import HostConfig

    seen: list[HostConfig] = []

    def serve(config: HostConfig, **_: object) -> int:
        seen.append(config)
        return 0

    monkeypatch.setattr(werk_host.server, "serve", serve)
    monkeypatch.setattr("werk_host.logs.configure_logging", lambda *_: None)  # keep this process's logging
    args = build_parser().parse_args(
        ["serve", "--home", str(tmp_path / "home"), "--store-max-states", "40", "--store-max-bytes", "5000"]
        + ["--store-max-states-per-key", "7", "--store-max-bytes-per-key", "900"]
    )
    assert args.handler(args) == 0
    assert seen[0].store_bounds == StoreBounds(40, 5000, 7, 900)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--store-max-states-per-key", "0"])
    defaults = build_parser().parse_args(["serve"])
    assert (defaults.store_max_states, defaults.store_max_bytes_per_key) == (None, None)

"""The prefill/decode control service, through HTTP on a real waitress server.

Backend: the inline in-memory test adapter (werk_host.testing.reference), reached only
through the hookspecs. Each test names the seed rule it checks.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import KEY
from werk_host.config import PersistenceDefaults, ServerLimits
from werk_host.protocol import CapabilityStatus, PersistenceMode, ReusePolicy
from werk_host.server import Host
from werk_host.service import capabilities as capabilities_module
from werk_host.service.handoffs import HandoffRegistry
from werk_host.store import layout as store_layout
from werk_host.testing.api import Api
from werk_host.testing.hosts import backend_host, running
from werk_host.testing.reference import MemoryAdapter, MemoryBackendPlugin

OTHER_KEY = "sk-werk-other-9876543210"


@dataclass
class Env:
    host: Host
    plugin: MemoryBackendPlugin
    api: Api

    @property
    def adapter(self) -> MemoryAdapter:
        adapter = self.host.fleet.adapter
        assert isinstance(adapter, MemoryAdapter)
        return adapter

    def prefill(self, text: str = "the quick brown fox", **extra: Any) -> tuple[int, dict[str, Any]]:
        body: dict[str, Any] = {"model_id": "tiny", "input": {"type": "text", "text": text}}
        body.update(extra)
        return self.api.post("/werk/v1/prefill", body)

    def decode(self, handoff: str, api: Api | None = None, **extra: Any) -> tuple[int, dict[str, Any]]:
        body = {"handoff": handoff, "allow_experimental": True, **extra}
        return (api or self.api).post("/werk/v1/decode", body)


def make_env(home: Path, **config: Any) -> Iterator[Env]:
    host, plugin = backend_host(home, api_keys=(KEY, OTHER_KEY, *config.pop("extra_keys", ())), **config)
    with running(host) as base:
        yield Env(host, plugin, Api(base, KEY))


@pytest.fixture
def env(home: Path) -> Iterator[Env]:
    yield from make_env(home)


def ok(result: tuple[int, dict[str, Any]]) -> dict[str, Any]:
    status, body = result
    assert status == 200, body
    data: dict[str, Any] = body["data"]
    return data


def err(result: tuple[int, dict[str, Any]], status: int, code: str) -> dict[str, Any]:
    got, body = result
    assert got == status, body
    assert body["error"]["code"] == code, body
    error: dict[str, Any] = body["error"]
    return error


# -- policy resolution and server defaults ------------------------------------------------
def test_protocol_defaults_are_auto_prefer_without_opt_in(env: Env) -> None:
    err(env.prefill(), 428, "experimental_opt_in_required")
    data = ok(env.prefill(allow_experimental=True))
    assert data["state_id"].startswith("st_") and data["tier"] == "disk"
    assert data["expires_unix_ms"] is None and data["reused"] is False
    assert data["prompt_tokens"] == 4


def test_server_persistence_supplies_policy_and_opt_in_for_absent_members(home: Path) -> None:
    defaults = PersistenceDefaults(mode=PersistenceMode.AUTO, reuse=ReusePolicy.PREFER, ttl_seconds=60, pin=True)
    for e in make_env(home, persistence=defaults):
        data = ok(e.prefill())  # no policy, no allow_experimental
        assert data["expires_unix_ms"] is not None  # server TTL applied
        status, page = e.api.get("/werk/v1/states")
        assert page["data"]["states"][0]["pinned"] is True  # server pin applied


def test_present_policy_owns_the_whole_policy(home: Path) -> None:
    defaults = PersistenceDefaults(mode=PersistenceMode.EPHEMERAL, ttl_seconds=60)
    for e in make_env(home, persistence=defaults):
        assert ok(e.prefill("a"))["state_id"] is None  # server mode ephemeral
        data = ok(e.prefill("b", policy={}))  # {} gets protocol defaults: auto, no TTL
        assert data["state_id"] is not None and data["expires_unix_ms"] is None


def test_explicit_false_is_never_promoted(home: Path) -> None:
    for e in make_env(home, persistence=PersistenceDefaults()):
        err(e.prefill(allow_experimental=False), 428, "experimental_opt_in_required")
        ok(e.prefill(policy={}))  # policy {} does not stop the server opt-in


def test_decode_gets_no_server_defaults(home: Path) -> None:
    for e in make_env(home, persistence=PersistenceDefaults()):
        handoff = ok(e.prefill())["handoff"]
        status, body = e.api.post("/werk/v1/decode", {"handoff": handoff})
        assert (status, body["error"]["code"]) == (428, "experimental_opt_in_required")


# -- modes ---------------------------------------------------------------------------------
def test_ephemeral_issues_handoff_without_named_state(env: Env) -> None:
    data = ok(env.prefill(policy={"mode": "ephemeral"}, allow_experimental=True))
    assert data["state_id"] is None and data["tier"] is None
    assert ok(env.api.get("/werk/v1/states"))["states"] == []
    out = ok(env.decode(data["handoff"], max_tokens=2))
    assert out == {"text": "the quick", "handoff": None, "completion_tokens": 2, "finish_reason": "length"}


def test_memory_mode_requires_a_volatile_tier(env: Env) -> None:
    err(env.prefill(policy={"mode": "memory"}, allow_experimental=True), 501, "unsupported")
    assert env.host.service.handoffs.counts(None)[1] == 0
    assert "prefill" not in env.adapter.calls


@pytest.mark.parametrize("mode", ["disk", "auto"])
def test_disk_and_auto_fail_rather_than_weaken_without_snapshot(env: Env, mode: str) -> None:
    env.adapter.fail.add("no-snapshot")
    err(env.prefill(policy={"mode": mode}, allow_experimental=True), 501, "unsupported")
    assert env.host.service.handoffs.counts(None)[1] == 0  # reservation rolled back
    assert env.adapter.live == {}  # the prefilled handle was released


@pytest.fixture
def evidence_uncached(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reference adapter's evidence changes by hand here, with no operation in between:
    request this before ``env`` so that its host asks for reports afresh every time."""
    monkeypatch.setattr(capabilities_module, "EVIDENCE_TTL_S", 0.0)


def test_disk_mode_gates_persistence(evidence_uncached: None, env: Env) -> None:
    env.adapter.statuses["runtime.state.persistence"] = CapabilityStatus.UNAVAILABLE
    err(env.prefill(policy={"mode": "disk"}, allow_experimental=True), 503, "unavailable")
    assert "prefill" not in env.adapter.calls
    env.adapter.statuses["runtime.state.persistence"] = CapabilityStatus.UNSUPPORTED
    err(env.prefill(policy={"mode": "disk"}, allow_experimental=True), 501, "unsupported")


# -- reuse and the compatibility key -------------------------------------------------
def test_prefer_reuses_an_exactly_compatible_state(env: Env) -> None:
    first = ok(env.prefill(allow_experimental=True))
    second = ok(env.prefill(allow_experimental=True))
    assert second["reused"] is True and second["state_id"] == first["state_id"]
    assert env.adapter.calls.count("prefill") == 1
    out = ok(env.decode(second["handoff"], max_tokens=8))
    assert out["text"] == "the quick brown fox"


def test_reuse_after_live_state_is_gone_restores_from_store(env: Env) -> None:
    ok(env.prefill(allow_experimental=True))
    env.adapter.live.clear()
    second = ok(env.prefill(allow_experimental=True))
    assert second["reused"] is True
    assert ok(env.decode(second["handoff"]))["text"] == "the quick brown fox"
    assert "restore" in env.adapter.calls


def test_disabled_reuse_always_prefills(env: Env) -> None:
    a = ok(env.prefill(policy={"reuse": "disabled"}, allow_experimental=True))
    b = ok(env.prefill(policy={"reuse": "disabled"}, allow_experimental=True))
    assert a["state_id"] != b["state_id"] and not b["reused"]
    assert env.adapter.calls.count("prefill") == 2


def test_required_reuse_with_no_match_is_conflict(env: Env) -> None:
    err(env.prefill(policy={"reuse": "required"}, allow_experimental=True), 409, "conflict")
    assert "prefill" not in env.adapter.calls
    assert env.host.service.handoffs.counts(None)[1] == 0


def test_required_reuse_with_incompatible_candidate(env: Env) -> None:
    ok(env.prefill(allow_experimental=True))
    env.adapter.restart()  # new process generation: same prompt, different compatibility key
    error = err(env.prefill(policy={"reuse": "required"}, allow_experimental=True), 409, "incompatible_state")
    assert error["details"] == {"mismatch_fields": ["generation"]}
    # prefer falls through to a fresh prefill instead
    assert ok(env.prefill(allow_experimental=True))["reused"] is False


def _payload_file(env: Env, state_id: str) -> Path:
    (path,) = env.host.config.home.glob(f"runtime-state/v1/p_*/{state_id}/payload.bin")
    return path


def _flip_in_place(path: Path) -> None:
    """Invert one byte in the middle of ``path``: same inode, same size."""
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.seek(size // 2)
        byte = f.read(1)
        f.seek(size // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    assert path.stat().st_size == size


def _quarantined(env: Env) -> list[str]:
    qdir = env.host.config.home / "runtime-state" / "v1" / ".quarantine"
    return sorted(n.rsplit("-", 1)[1] for n in os.listdir(qdir)) if qdir.exists() else []


def _listed_ids(env: Env) -> set[str]:
    return {s["id"] for s in ok(env.api.get("/werk/v1/states"))["states"]}


def test_prefer_recomputes_instead_of_reusing_a_corrupt_state(env: Env) -> None:
    """prefer uses a compatible state only when its integrity verifies, else prefills anew."""
    first = ok(env.prefill(allow_experimental=True))
    _flip_in_place(_payload_file(env, first["state_id"]))
    second = ok(env.prefill(allow_experimental=True))
    assert second["reused"] is False and second["state_id"] != first["state_id"]
    assert env.adapter.calls.count("prefill") == 2
    assert _listed_ids(env) == {second["state_id"]}  # the corrupt one is gone from listings ...
    assert _quarantined(env) == [first["state_id"]]  # ... because it was quarantined
    assert ok(env.decode(second["handoff"], max_tokens=8))["text"] == "the quick brown fox"
    third = ok(env.prefill(allow_experimental=True))  # the fresh state is reused from now on
    assert third["reused"] is True and third["state_id"] == second["state_id"]


def test_required_reuse_of_a_corrupt_state_is_conflict_with_reason(env: Env) -> None:
    """required never falls through: 409 conflict saying why, and no handoff issued."""
    first = ok(env.prefill(allow_experimental=True))
    _flip_in_place(_payload_file(env, first["state_id"]))
    assert env.host.service.handoffs.counts(None)[1] == 1  # the first prefill's handoff
    error = err(env.prefill(policy={"reuse": "required"}, allow_experimental=True), 409, "conflict")
    assert error["details"] == {"reason": "corrupt_state"}
    assert "runtime-state" not in error["message"] and first["state_id"] not in error["message"]
    assert env.adapter.calls.count("prefill") == 1  # no fresh prefill
    assert env.host.service.handoffs.counts(None)[1] == 1  # none issued: the reservation was rolled back
    assert _listed_ids(env) == set() and _quarantined(env) == [first["state_id"]]
    err(env.decode(first["handoff"]), 404, "not_found")  # it named the state now quarantined


def test_reuse_takes_the_next_newest_compatible_state_when_the_newest_is_corrupt(env: Env) -> None:
    for _ in range(2):
        ok(env.prefill(policy={"reuse": "disabled"}, allow_experimental=True))
    states = ok(env.api.get("/werk/v1/states"))["states"]
    newest, other = sorted(states, key=lambda s: (s["created_unix_ms"], s["id"]), reverse=True)
    assert ok(env.prefill(allow_experimental=True))["state_id"] == newest["id"]  # both intact: newest wins
    _flip_in_place(_payload_file(env, newest["id"]))
    env.adapter.live.clear()  # the reused state must come from the store
    reused = ok(env.prefill(policy={"reuse": "required"}, allow_experimental=True))
    assert reused["reused"] is True and reused["state_id"] == other["id"]
    assert _quarantined(env) == [newest["id"]] and _listed_ids(env) == {other["id"]}
    assert ok(env.decode(reused["handoff"]))["text"] == "the quick brown fox"


def test_unchanged_payload_is_never_rehashed_and_a_touch_forces_a_new_hash(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_layout, "RACY_MARGIN_NS", 0)  # no need to wait out the racy-timestamp margin
    hashed: list[int] = []
    real_hash = store_layout.hash_fd

    def counting_hash(fd: int, expected_size: int) -> tuple[str, int]:
        hashed.append(expected_size)
        return real_hash(fd, expected_size)

    monkeypatch.setattr(store_layout, "hash_fd", counting_hash)
    first = ok(env.prefill(allow_experimental=True))
    for _ in range(2):
        reused = ok(env.prefill(allow_experimental=True))
        assert reused["reused"] is True
        assert ok(env.decode(reused["handoff"]))["text"]  # decode reads the verified payload
    assert hashed == []  # the commit hashed while streaming and remembered it: never hashed again
    payload = _payload_file(env, first["state_id"])
    before = payload.stat()
    os.utime(payload, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000))  # new mtime and ctime
    assert ok(env.prefill(allow_experimental=True))["reused"] is True
    assert len(hashed) == 1  # the changed stat identity forced a re-verification
    again = ok(env.prefill(allow_experimental=True))
    assert again["reused"] is True
    assert ok(env.decode(again["handoff"]))["text"]
    assert len(hashed) == 1


def test_reuse_never_crosses_principals(env: Env) -> None:
    ok(env.prefill(allow_experimental=True))
    other = env.api.as_key(OTHER_KEY)
    status, body = other.post(
        "/werk/v1/prefill",
        {
            "model_id": "tiny",
            "input": {"type": "text", "text": "the quick brown fox"},
            "policy": {"reuse": "required"},
            "allow_experimental": True,
        },
    )
    assert (status, body["error"]["code"]) == (409, "conflict")


def test_unknown_model_is_not_found(env: Env) -> None:
    status, body = env.api.post(
        "/werk/v1/prefill", {"model_id": "nope", "input": {"type": "text", "text": "x"}, "allow_experimental": True}
    )
    assert (status, body["error"]["code"]) == (404, "not_found")


# -- handoffs -------------------------------------------------------------------------------
def test_handoff_is_single_use_even_when_decode_fails(env: Env) -> None:
    handoff = ok(env.prefill(allow_experimental=True))["handoff"]
    env.adapter.fail.add("decode")
    err(env.decode(handoff), 500, "internal")
    env.adapter.fail.discard("decode")
    err(env.decode(handoff), 410, "expired_handoff")
    assert env.host.service.handoffs.counts(None)[1] == 0  # replacement reservation released


def test_foreign_handoff_is_gone_for_them_and_kept_for_owner(env: Env) -> None:
    handoff = ok(env.prefill(allow_experimental=True))["handoff"]
    err(env.decode(handoff, api=env.api.as_key(OTHER_KEY)), 410, "expired_handoff")
    assert ok(env.decode(handoff))["completion_tokens"] == 4


def test_handoff_bound_to_process_identity(env: Env) -> None:
    handoff = ok(env.prefill(policy={"mode": "ephemeral"}, allow_experimental=True))["handoff"]
    env.adapter.restart()
    err(env.decode(handoff), 410, "expired_handoff")


def test_handoff_expires_after_ttl(env: Env) -> None:
    now = [1000.0]
    registry = HandoffRegistry(clock=lambda: now[0])
    env.host.service.handoffs = registry
    handoff = ok(env.prefill(allow_experimental=True))["handoff"]
    now[0] += 15 * 60
    err(env.decode(handoff), 410, "expired_handoff")


def test_oversized_completion_is_rejected_and_reservation_released(env: Env) -> None:
    handoff = ok(env.prefill(allow_experimental=True))["handoff"]
    env.adapter.fail.add("huge-text")
    err(env.decode(handoff), 429, "resource_exhausted")
    assert env.host.service.handoffs.counts(None)[1] == 0


def test_continuation_handoff_uses_the_held_reservation(env: Env) -> None:
    handoff = ok(env.prefill(policy={"mode": "ephemeral"}, allow_experimental=True))["handoff"]
    env.adapter.fail.add("continue")
    out = ok(env.decode(handoff))
    assert out["handoff"] and out["handoff"] != handoff
    assert env.host.service.handoffs.counts(None)[1] == 1


def test_per_principal_bound_is_retryable_and_isolated(env: Env) -> None:
    for i in range(128):
        ok(env.prefill(f"p{i}", policy={"mode": "ephemeral"}, allow_experimental=True))
    error = err(
        env.prefill("one more", policy={"mode": "ephemeral"}, allow_experimental=True), 429, "resource_exhausted"
    )
    assert error["retryable"] is True
    other = env.api.as_key(OTHER_KEY)
    status, _ = other.post(
        "/werk/v1/prefill",
        {
            "model_id": "tiny",
            "input": {"type": "text", "text": "x"},
            "policy": {"mode": "ephemeral"},
            "allow_experimental": True,
        },
    )
    assert status == 200


def test_concurrent_prefills_never_exceed_bounds_or_leak(home: Path) -> None:
    keys = tuple(f"sk-werk-load-{i:02d}-abcdef" for i in range(10))
    # room in the inference gate for all 64 clients at once, so that only the handoff bounds
    # refuse (docs/operations.md, "Inference concurrency")
    for e in make_env(home, extra_keys=keys, limits=ServerLimits(threads=96, inference_slots=64)):
        registry = e.host.service.handoffs
        peak = {"total": 0, "per": 0}
        lock = threading.Lock()
        original_issue = registry.issue

        def observed_issue(reservation: Any, record: Any) -> str:
            secret = original_issue(reservation, record)
            with registry._lock:
                total = len(registry._live)
                per = sum(1 for r in registry._live.values() if r.principal_id == record.principal_id)
            with lock:
                peak["total"], peak["per"] = max(peak["total"], total), max(peak["per"], per)
            return secret

        registry.issue = observed_issue  # type: ignore[method-assign]
        results: list[int] = []

        def worker(n: int) -> None:
            api = e.api.as_key(keys[n % len(keys)])
            for i in range(24):
                text = f"FAIL {n}-{i}" if i % 7 == 3 else f"{n}-{i}"  # injected backend failures
                status, _ = api.post(
                    "/werk/v1/prefill",
                    {
                        "model_id": "tiny",
                        "input": {"type": "text", "text": text},
                        "policy": {"mode": "ephemeral"},
                        "allow_experimental": True,
                    },
                )
                with lock:
                    results.append(status)

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(64)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert peak["total"] <= 1024 and peak["per"] <= 128
        live, total = registry.counts(None)
        assert total == results.count(200)  # every success is live; no reservation leaked
        assert total <= 1024
        assert results.count(429) > 0  # the bounds were actually reached
        assert set(results) == {200, 429, 500}


# -- memory reservations around backend work ---------------------------------------------
def counters(e: Env) -> dict[str, int]:
    status, body = e.api.get("/werk/v1/memory")
    assert status == 200
    return body["data"]["counters"]


def test_bounded_adapter_reserves_before_prefill_and_releases_with_the_lease(evidence_uncached: None, env: Env) -> None:
    caps = {c["id"]: c["status"] for c in env.api.get("/werk/v1/capabilities")[1]["data"]}
    assert caps["runtime.memory.reservations"] == "unavailable"  # no bound supplied yet
    env.adapter.memory_requirement = 4096
    caps = {c["id"]: c["status"] for c in env.api.get("/werk/v1/capabilities")[1]["data"]}
    assert caps["runtime.memory.reservations"] == "supported"
    handoff = ok(env.prefill(policy={"mode": "ephemeral"}, allow_experimental=True))["handoff"]
    c = counters(env)
    assert (c["managed_allocations"], c["active_reservations"]) == (1, 0)
    ok(env.decode(handoff))
    assert counters(env)["managed_allocations"] == 0  # the handoff was the lease
    named = ok(env.prefill("a named one", allow_experimental=True))
    assert counters(env)["managed_allocations"] == 1
    ok(env.decode(named["handoff"]))
    assert counters(env)["managed_allocations"] == 1  # a named state keeps its lease
    ok(env.api.post(f"/werk/v1/states/{named['state_id']}/actions", {"action": "evict"}))
    assert counters(env)["managed_allocations"] == 0


def test_denied_reservation_never_reaches_the_backend(env: Env) -> None:
    env.adapter.memory_requirement = 1 << 60  # beyond any host
    err(env.prefill(allow_experimental=True), 429, "resource_exhausted")
    assert "prefill" not in env.adapter.calls
    assert env.host.service.handoffs.counts(None)[1] == 0
    assert counters(env)["active_reservations"] == 0


def test_state_larger_than_its_reservation_is_not_accounted(env: Env) -> None:
    env.adapter.memory_requirement = 3  # the prompt's state is larger than this bound
    err(env.prefill(allow_experimental=True), 500, "internal")
    c = counters(env)
    assert (c["active_reservations"], c["managed_allocations"]) == (0, 0)
    assert env.adapter.live == {}  # the disagreeing state was released
    assert ok(env.api.get("/werk/v1/states"))["states"] == []

"""State list/action/prune routes and the memory route, over HTTP with the test backend."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import KEY
from werk_host.server import Host
from werk_host.testing.api import Api
from werk_host.testing.hosts import backend_host, running

OTHER_KEY = "sk-werk-states-other-123456"


@pytest.fixture
def api(home: Path) -> Iterator[tuple[Api, Host]]:
    host, _ = backend_host(home, api_keys=(KEY, OTHER_KEY))
    with running(host) as base:
        yield Api(base, KEY), host


def make_states(api: Api, n: int, prefix: str = "prompt", **policy: Any) -> list[str]:
    ids = []
    for i in range(n):
        status, body = api.post(
            "/werk/v1/prefill",
            {
                "model_id": "tiny",
                "input": {"type": "text", "text": f"{prefix} {i}"},
                "policy": policy,
                "allow_experimental": True,
            },
        )
        assert status == 200, body
        ids.append(body["data"]["state_id"])
    return ids


def data(result: tuple[int, dict[str, Any]], status: int = 200) -> Any:
    got, body = result
    assert got == status, body
    return body["data"] if status == 200 else body["error"]


def test_pages_are_ordered_and_cursors_are_opaque_and_bound(api: tuple[Api, Host]) -> None:
    client, _ = api
    ids = make_states(client, 5)
    seen: list[str] = []
    page = data(client.get("/werk/v1/states", limit=2))
    while True:
        seen += [s["id"] for s in page["states"]]
        assert all(
            set(s)
            == {
                "id",
                "model_id",
                "backend",
                "tier",
                "status",
                "bytes",
                "created_unix_ms",
                "last_accessed_unix_ms",
                "expires_unix_ms",
                "pinned",
                "reusable",
            }
            for s in page["states"]
        )
        if not page["next_cursor"]:
            break
        assert not any(i in page["next_cursor"] for i in ids)
        page = data(client.get("/werk/v1/states", limit=2, cursor=page["next_cursor"]))
    assert seen == sorted(ids)
    first = data(client.get("/werk/v1/states", limit=2))
    # a cursor is bound to its principal and filters
    assert (
        data(client.as_key(OTHER_KEY).get("/werk/v1/states", cursor=first["next_cursor"]), 400)["code"]
        == "invalid_request"
    )
    assert (
        data(client.get("/werk/v1/states", cursor=first["next_cursor"], model_id="tiny"), 400)["code"]
        == "invalid_request"
    )
    assert (
        data(client.get("/werk/v1/states", cursor=first["next_cursor"][:-2] + "zz"), 400)["code"] == "invalid_request"
    )


def test_filters(api: tuple[Api, Host]) -> None:
    client, _ = api
    make_states(client, 2)
    assert len(data(client.get("/werk/v1/states", model_id="tiny", tier="disk"))["states"]) == 2
    assert data(client.get("/werk/v1/states", model_id="other"))["states"] == []
    assert data(client.get("/werk/v1/states", tier="ram"))["states"] == []
    assert data(client.get("/werk/v1/states", tier="floppy"), 400)["code"] == "invalid_request"


def test_pin_unpin_with_dry_run(api: tuple[Api, Host]) -> None:
    client, _ = api
    (sid,) = make_states(client, 1)
    preview = data(client.post(f"/werk/v1/states/{sid}/actions", {"action": "pin", "dry_run": True}))
    assert preview["dry_run"] is True and preview["changed"] is True and preview["state"]["pinned"] is True
    assert data(client.get("/werk/v1/states"))["states"][0]["pinned"] is False
    done = data(client.post(f"/werk/v1/states/{sid}/actions", {"action": "pin"}))
    assert done["changed"] is True and done["state"]["pinned"] is True
    again = data(client.post(f"/werk/v1/states/{sid}/actions", {"action": "pin"}))
    assert again["changed"] is False
    assert data(client.post(f"/werk/v1/states/{sid}/actions", {"action": "unpin"}))["state"]["pinned"] is False


def test_evict_preview_then_execute(api: tuple[Api, Host]) -> None:
    client, _ = api
    (sid,) = make_states(client, 1)
    assert data(client.post(f"/werk/v1/states/{sid}/actions", {"action": "evict", "dry_run": True}))["changed"] is True
    assert len(data(client.get("/werk/v1/states"))["states"]) == 1
    assert data(client.post(f"/werk/v1/states/{sid}/actions", {"action": "evict"}))["changed"] is True
    assert data(client.get("/werk/v1/states"))["states"] == []
    assert data(client.post(f"/werk/v1/states/{sid}/actions", {"action": "evict"}), 404)["code"] == "not_found"


def test_explicit_evict_wins_over_a_live_handoff(api: tuple[Api, Host]) -> None:
    client, host = api
    status, body = client.post(
        "/werk/v1/prefill", {"model_id": "tiny", "input": {"type": "text", "text": "held"}, "allow_experimental": True}
    )
    sid, handoff = body["data"]["state_id"], body["data"]["handoff"]
    assert data(client.post(f"/werk/v1/states/{sid}/actions", {"action": "evict"}))["changed"] is True
    host.fleet.adapter.live.clear()  # the backend's live copy is gone too (e.g. slot reused)
    error = data(client.post("/werk/v1/decode", {"handoff": handoff, "allow_experimental": True}), 404)
    assert error["code"] == "not_found"


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"action": "promote", "target_tier": "ram", "allow_experimental": True}, 501, "unsupported"),
        ({"action": "promote", "target_tier": "vram", "allow_experimental": True}, 501, "unsupported"),
        ({"action": "promote", "target_tier": "disk"}, 400, "invalid_request"),
        ({"action": "demote", "target_tier": "ram"}, 400, "invalid_request"),
        ({"action": "demote", "target_tier": "external"}, 400, "invalid_request"),
        ({"action": "promote"}, 400, "invalid_request"),
        ({"action": "pin", "target_tier": "ram"}, 400, "invalid_request"),
        ({"action": "pin", "extra": 1}, 400, "invalid_request"),
        ({"action": "teleport"}, 400, "invalid_request"),
    ],
)
def test_tier_movement_rules(api: tuple[Api, Host], body: dict[str, Any], status: int, code: str) -> None:
    client, _ = api
    (sid,) = make_states(client, 1)
    assert data(client.post(f"/werk/v1/states/{sid}/actions", body), status)["code"] == code


def test_foreign_state_is_indistinguishable_from_absent(api: tuple[Api, Host]) -> None:
    client, _ = api
    (sid,) = make_states(client, 1)
    other = client.as_key(OTHER_KEY)
    foreign = data(other.post(f"/werk/v1/states/{sid}/actions", {"action": "pin"}), 404)
    absent = data(other.post("/werk/v1/states/st_doesnotexist/actions", {"action": "pin"}), 404)
    assert foreign == absent
    assert data(other.get("/werk/v1/states"))["states"] == []
    assert (
        data(other.post("/werk/v1/states/prune", {"selector": {"kind": "all", "confirm": True}, "dry_run": False}))[
            "removed"
        ]
        == 0
    )
    assert len(data(client.get("/werk/v1/states"))["states"]) == 1


def test_prune_selectors_preview_and_execute(api: tuple[Api, Host]) -> None:
    client, _ = api
    ids = make_states(client, 4)
    preview = data(client.post("/werk/v1/states/prune", {"selector": {"kind": "ids", "ids": ids[:2]}}))
    assert preview["dry_run"] is True and preview["matched"] == 2 and preview["removed"] == 0
    assert preview["bytes"] == sum(len(f"prompt {i}".encode()) for i in range(2))
    assert len(data(client.get("/werk/v1/states"))["states"]) == 4
    done = data(client.post("/werk/v1/states/prune", {"selector": {"kind": "ids", "ids": ids[:2]}, "dry_run": False}))
    assert (done["matched"], done["removed"], done["dry_run"]) == (2, 2, False)
    by_filter = data(
        client.post("/werk/v1/states/prune", {"selector": {"kind": "filter", "model_id": "tiny"}, "dry_run": False})
    )
    assert by_filter["removed"] == 2
    assert data(client.get("/werk/v1/states"))["states"] == []


@pytest.mark.parametrize(
    "selector",
    [
        {"kind": "all"},
        {"kind": "all", "confirm": False},
        {"kind": "filter"},
        {"kind": "filter", "model_id": None, "tier": None},
        {"kind": "ids", "ids": []},
        {"kind": "ids", "ids": ["st_a", "st_a"]},
        {"kind": "ids", "ids": [f"st_{i}" for i in range(101)]},
        {"kind": "everything"},
        {"kind": "ids", "ids": ["st_a"], "model_id": "x"},
    ],
)
def test_prune_rejects_unsafe_selectors(api: tuple[Api, Host], selector: dict[str, Any]) -> None:
    client, _ = api
    assert data(client.post("/werk/v1/states/prune", {"selector": selector}), 400)["code"] == "invalid_request"


def test_pinned_states_are_kept_by_prune_all_only_when_expired(api: tuple[Api, Host]) -> None:
    client, _ = api
    make_states(client, 1, pin=True)
    result = data(
        client.post("/werk/v1/states/prune", {"selector": {"kind": "all", "confirm": True}, "dry_run": False})
    )
    # an explicit prune is an operator decision: pinning protects only from policy eviction
    assert result["removed"] == 1


def test_memory_route_reports_real_host_and_null_accelerator(api: tuple[Api, Host]) -> None:
    client, host = api
    report = data(client.get("/werk/v1/memory"))
    assert (
        report["host"]["capacity_bytes"] > 0
        and 0 < report["host"]["available_bytes"] <= report["host"]["capacity_bytes"]
    )
    assert report["host"]["pressure"] in ("normal", "soft", "hard", "emergency")
    caps = {c["id"]: c["status"] for c in data(client.get("/werk/v1/capabilities"))}
    assert caps["runtime.memory.telemetry.host"] == "supported"
    assert caps["runtime.memory.reservations"] == "unavailable"
    if caps["runtime.memory.telemetry.accelerator"] == "unavailable":  # no NVML driver here
        assert report["accelerator"]["capacity_bytes"] is None
        assert report["accelerator"]["available_bytes"] is None
        assert report["accelerator"]["pressure"] == "unknown"
    assert set(report["counters"]) == {
        "active_reservations",
        "managed_allocations",
        "pressure_actions_in_flight",
        "completed_demotions",
        "completed_evictions",
        "failed_releases",
        "orphaned_release_bytes",
        "telemetry_errors",
        "backend_cleanup_failures",
        "backend_cleanup_latched",
    }
    obs = data(client.get("/werk/v1/observability"))
    assert obs["memory"]["host"]["capacity_bytes"] > 0


def test_listing_follows_every_change_while_its_caches_are_warm(
    api: tuple[Api, Host], monkeypatch: pytest.MonkeyPatch
) -> None:
    from werk_host.store import StateStore, layout

    monkeypatch.setattr(layout, "RACY_MARGIN_NS", 0)  # trust timestamps at once: the caches are used
    client, host = api

    def listed() -> dict[str, bool]:
        return {s["id"]: s["pinned"] for s in data(client.get("/werk/v1/states"))["states"]}

    a, b, c = make_states(client, 3, prefix="warm")
    assert listed() == listed() == {a: False, b: False, c: False}
    assert data(client.post(f"/werk/v1/states/{a}/actions", {"action": "pin"}))["changed"] is True
    assert listed() == {a: True, b: False, c: False}
    assert data(client.post(f"/werk/v1/states/{a}/actions", {"action": "unpin"}))["changed"] is True
    assert data(client.post(f"/werk/v1/states/{b}/actions", {"action": "evict"}))["changed"] is True
    assert listed() == {a: False, c: False}
    # another view of the same catalog (as `werk cache` in another process would be) changes it
    principal = host.auth.authenticate(KEY)
    assert principal is not None
    other = StateStore(host.config.home / "runtime-state" / "v1")
    other.set_pinned(principal.id, c, True)
    assert other.delete(principal.id, a)
    assert listed() == {c: True}

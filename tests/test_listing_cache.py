"""A state listing is kept under explicit stamps (werk_host/service/cache.py, service/states.py).

It is the same kept result, with the same JSON text, while neither the store page's stamp nor
the compatibility keys' evidence moved, even when a layer below hands out copies; and it
changes exactly when one of them does: a commit, a delete, a backend restart.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import falcon.testing
import pytest

import werk_host.service.capabilities as capabilities_module
from werk_host.protocol import StateListQuery
from werk_host.server import Host
from werk_host.service.cache import Shared
from werk_host.store.store import ListedPage, StateStore
from werk_host.testing.hosts import backend_host

KEY = "sk-werk-listing-cache-0042"
QUERY = StateListQuery(limit=100)


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Host, falcon.testing.TestClient]]:
    monkeypatch.setattr(capabilities_module, "EVIDENCE_TTL_S", 3600.0)  # no window ends within the test
    host, _ = backend_host(tmp_path / "home", api_keys=(KEY,))
    try:
        yield host, falcon.testing.TestClient(host.app, headers={"Authorization": f"Bearer {KEY}"})
    finally:
        host.close()


def commit(client: falcon.testing.TestClient, text: str) -> str:
    body = {"model_id": "tiny", "input": {"type": "text", "text": text}, "policy": {"mode": "disk"}}
    result = client.simulate_post("/werk/v1/prefill", json={**body, "allow_experimental": True})
    assert result.status_code == 200, result.text
    state_id: str = result.json["data"]["state_id"]
    return state_id


def listing(host: Host) -> Shared[Any]:
    principal = host.auth.authenticate(KEY)
    assert principal is not None
    with host.fleet.scope(principal) as scope:
        return host.service.list_states(scope, QUERY)


def settled(host: Host) -> Shared[Any]:
    """The listing once the store has seen its own change (the read right after a change is
    never kept: watch.py), then kept: the next listing is the very same result."""
    listing(host)
    kept = listing(host)
    assert listing(host) is kept
    return kept


def ids(shared: Shared[Any]) -> list[str]:
    return [s.id for s in shared.value.states]


def test_a_listing_changes_exactly_when_a_stamp_does(env: tuple[Host, falcon.testing.TestClient]) -> None:
    host, client = env
    first = commit(client, "one two")
    kept = settled(host)
    assert ids(kept) == [first]
    for _ in range(5):
        assert listing(host) is kept  # nothing changed: the kept result
    text = kept.text
    assert listing(host).text is text  # serialized once

    second = commit(client, "three four")  # a commit: the store page's stamp moves
    after_commit = settled(host)
    assert after_commit is not kept and sorted(ids(after_commit)) == sorted([first, second])

    evicted = client.simulate_post(f"/werk/v1/states/{first}/actions", json={"action": "evict"})
    assert evicted.status_code == 200, evicted.text  # a delete
    after_delete = settled(host)
    assert after_delete is not after_commit and ids(after_delete) == [second]

    adapter = host.fleet.adapter
    assert adapter is not None and after_delete.value.states[0].reusable is True
    adapter.restart()  # a new backend process: new evidence, another compatibility key
    after_restart = listing(host)  # at once: the store did not change, the evidence did
    assert after_restart is not after_delete and after_restart.value.states[0].reusable is False
    assert listing(host) is after_restart


def test_a_copy_below_does_not_defeat_the_cache(
    env: tuple[Host, falcon.testing.TestClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store that hands out a fresh copy of its page each time is still cached by the page's
    stamp, not by the page object's identity."""
    host, client = env
    commit(client, "one two")
    real = StateStore.list_page

    def copying(self: StateStore, principal: str, **kwargs: Any) -> ListedPage:
        page = real(self, principal, **kwargs)
        return ListedPage(list(page.records), page.after, page.stamp)

    monkeypatch.setattr(StateStore, "list_page", copying)
    kept = settled(host)
    over_http = [client.simulate_get("/werk/v1/states").json["data"] for _ in range(2)]
    assert over_http[0] == over_http[1] == kept.value.model_dump(mode="json")

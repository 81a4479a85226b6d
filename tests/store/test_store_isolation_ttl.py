"""Principal isolation and TTL-over-pinning semantics."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from werk_host.errors import ErrorCode, WerkError
from werk_host.store import StateStore

from .helpers import P1, P2, FakeClock, commit, read_payload, state_dir


def test_two_principals_with_identical_prompts_never_cross(store: StateStore, root: Path) -> None:
    a = commit(store, P1, data=b"alice", prompt_fingerprint="same-fp", model_id="m")
    b = commit(store, P2, data=b"bob", prompt_fingerprint="same-fp", model_id="m")

    assert [r.id for r in store.find_by_fingerprint(P1, "same-fp")] == [a.id]
    assert [r.id for r in store.find_by_fingerprint(P2, "same-fp")] == [b.id]
    assert [r.id for r in store.list_states(P1)[0]] == [a.id]
    assert [r.id for r in store.list_states(P2)[0]] == [b.id]
    assert [r.id for r in store.list_states(P1, after="st_" + "0" * 32)[0]] == [a.id]

    # a foreign id is indistinguishable from an absent one
    assert store.get(P1, b.id) is None
    for action in (
        lambda: store.set_pinned(P1, b.id, True),
        lambda: read_payload(store, P1, b.id),
        lambda: store.verify(P1, b.id),
    ):
        with pytest.raises(WerkError) as err:
            action()
        assert err.value.code is ErrorCode.NOT_FOUND
    assert store.delete(P1, b.id) is False
    assert store.prune(P1, ids=[b.id], dry_run=False).matched == 0
    assert store.prune(P1, model_id="m", dry_run=False).removed == 1  # only a
    assert store.prune(P1, everything=True, dry_run=False).removed == 0
    assert store.get(P2, b.id) is not None
    assert read_payload(store, P2, b.id) == b"bob"
    assert not (state_dir(root, P2, b.id) / "pinned").exists()
    assert os.listdir(root / f"p_{P1}") == []


def test_ttl_beats_pinning(store: StateStore, root: Path, clock: FakeClock) -> None:
    pinned = commit(store, ttl_seconds=60, pinned=True, prompt_fingerprint="fp")
    plain = commit(store, ttl_seconds=120)
    forever = commit(store, pinned=True)
    assert pinned.expires_unix_ms == pinned.created_unix_ms + 60_000

    clock.advance(59.999)
    assert store.get(P1, pinned.id) is not None
    clock.advance(0.001)
    assert pinned.is_expired(int(clock.now * 1000))
    # invisible to every read, though still on disk (reads never delete)
    assert store.get(P1, pinned.id) is None
    assert pinned.id not in {r.id for r in store.list_states(P1)[0]}
    assert store.find_by_fingerprint(P1, "fp") == []
    assert store.prune(P1, everything=True).matched == 2
    with pytest.raises(WerkError) as err:
        read_payload(store, P1, pinned.id)
    assert err.value.code is ErrorCode.NOT_FOUND
    assert state_dir(root, P1, pinned.id).exists()
    # and the next real mutation deletes it, pinning notwithstanding
    with pytest.raises(WerkError) as err:
        store.set_pinned(P1, pinned.id, True)
    assert err.value.code is ErrorCode.NOT_FOUND
    assert not state_dir(root, P1, pinned.id).exists()
    assert store.get(P1, plain.id) is not None and store.get(P1, forever.id) is not None

    clock.advance(3600)
    StateStore(root, clock=clock).reconcile()  # a fresh process view deletes it too
    assert not state_dir(root, P1, plain.id).exists() and not (root / ".quarantine").exists()
    assert [r.id for r in store.list_states(P1)[0]] == [forever.id]
    clock.advance(10**7)
    assert store.get(P1, forever.id) is not None  # no TTL, no expiry

"""The read side's per-state look cache never outlives a change, made here or by another process."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from werk_host.store import StateStore, layout

from .helpers import P1, FakeClock, commit, read_payload

_OTHER_PROCESS = """
import io, json, sys
from werk_host.store import StateStore
root, principal, ops = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
store = StateStore(root)
out = {}
for op, arg in ops:
    if op == "delete":
        out[op] = store.delete(principal, arg)
    elif op == "pin":
        out[op] = store.set_pinned(principal, arg, True).pinned
    elif op == "read":
        with store.open_payload(principal, arg) as f:
            out[op] = len(f.read())
    elif op == "commit":
        rec = store.commit(principal, model_id="tiny-model", backend="llamacpp",
                           compat_key={"backend_fingerprint": "bin-1", "process_generation": "gen-1"},
                           payload=io.BytesIO(b"from-another-process"))
        out[op] = rec.id
print(json.dumps(out))
"""


def _other_process(root: Path, ops: list[tuple[str, str]]) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", _OTHER_PROCESS, str(root), P1, json.dumps(ops)],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    result: dict[str, object] = json.loads(done.stdout)
    return result


@pytest.fixture
def no_racy_margin(monkeypatch: pytest.MonkeyPatch) -> None:
    """Trust directory timestamps at once, so a look is cached right after a commit."""
    monkeypatch.setattr(layout, "RACY_MARGIN_NS", 0)


def _listed(store: StateStore) -> dict[str, bool]:
    return {r.id: r.pinned for r in store.list_states(P1)[0]}


def _cached_ids(store: StateStore) -> set[str]:
    return {sid for (_p, sid) in store._look_cache}


@pytest.mark.usefixtures("no_racy_margin")
def test_changes_by_another_process_show_at_once(make_store: Callable[..., StateStore], root: Path) -> None:
    store = make_store()
    a, b, c = (commit(store, data=bytes([i]) * 100) for i in range(3))
    assert _listed(store) == {a.id: False, b.id: False, c.id: False}
    assert _cached_ids(store) == {a.id, b.id, c.id}  # the second listing reads the cache
    assert _listed(store) == {a.id: False, b.id: False, c.id: False}

    got = _other_process(root, [("delete", a.id), ("pin", b.id), ("read", c.id), ("commit", "")])
    assert got["delete"] is True and got["pin"] is True and got["read"] == 100
    new_id = str(got["commit"])

    assert _listed(store) == {b.id: True, c.id: False, new_id: False}
    assert store.get(P1, a.id) is None
    got_c = store.get(P1, c.id)
    assert got_c is not None and got_c.last_accessed_unix_ms is not None  # the other process's access shows


@pytest.mark.usefixtures("no_racy_margin")
def test_changes_by_this_process_show_at_once(store: StateStore) -> None:
    a, b, c = (commit(store) for _ in range(3))
    assert len(_listed(store)) == 3 and _cached_ids(store) == {a.id, b.id, c.id}
    assert store.delete(P1, a.id)
    store.set_pinned(P1, b.id, True)
    assert _listed(store) == {b.id: True, c.id: False}
    store.set_pinned(P1, b.id, False)
    assert _listed(store) == {b.id: False, c.id: False}
    assert store.prune(P1, ids=[c.id], dry_run=False).removed == 1
    assert _listed(store) == {b.id: False}
    d = commit(store)
    assert _listed(store) == {b.id: False, d.id: False}


@pytest.mark.usefixtures("no_racy_margin")
def test_cached_state_still_expires(store: StateStore, clock: FakeClock) -> None:
    short = commit(store, ttl_seconds=60)
    keep = commit(store)
    assert set(_listed(store)) == {short.id, keep.id} and short.id in _cached_ids(store)
    clock.advance(61)
    assert set(_listed(store)) == {keep.id}
    assert store.get(P1, short.id) is None


@pytest.mark.usefixtures("no_racy_margin")
def test_state_found_corrupt_is_hidden_though_cached(store: StateStore, root: Path) -> None:
    rec = commit(store, data=b"x" * 1000)
    assert rec.id in _listed(store) and rec.id in _cached_ids(store)
    payload = root / f"p_{P1}" / rec.id / "payload.bin"
    payload.write_bytes(b"y" * 1000)  # rewritten in place: the directory itself is unchanged
    with pytest.raises(Exception, match="integrity"):
        read_payload(store, P1, rec.id)
    assert rec.id not in _listed(store)


def test_recently_changed_directory_is_not_remembered(store: StateStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(layout, "RACY_MARGIN_NS", 3_600_000_000_000)
    rec = commit(store)
    assert rec.id in _listed(store)
    assert _cached_ids(store) == set()

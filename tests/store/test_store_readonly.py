"""Reads, lists, inspection and dry runs are strictly read-only (tree snapshot before == after)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from werk_host.store import StateStore

from .helpers import P1, P2, FakeClock, commit, snapshot, staging_leftovers, state_dir


def _all_reads(store: StateStore, ids: list[str]) -> None:
    for principal in (P1, P2):
        for sid in ids:
            store.get(principal, sid)
        after = None
        while True:
            _page, after = store.list_states(principal, limit=2, after=after)
            if after is None:
                break
        store.list_states(principal, model_id="tiny-model", tier="disk")
        store.find_by_fingerprint(principal, "fp")
        store.prune(principal, everything=True)
        store.prune(principal, ids=ids[:3] or ["st_" + "0" * 32])
        store.prune(principal, model_id="tiny-model", older_than_unix_ms=2**62)
    store.inventory()
    store.purge(everything=True, dry_run=True)
    store.purge(ids=ids[:1] or ["st_" + "0" * 32], dry_run=True)


def test_reads_on_absent_root_create_nothing(werk_home_dir: Path, root: Path) -> None:
    store = StateStore(root)
    _all_reads(store, ["st_" + "1" * 32])
    assert list(werk_home_dir.iterdir()) == []
    gone = StateStore(werk_home_dir / "missing" / "runtime-state" / "v1")
    _all_reads(gone, [])
    assert not (werk_home_dir / "missing").exists()


def test_reads_and_dry_runs_change_nothing(make_store: Callable[..., StateStore], root: Path, clock: FakeClock) -> None:
    writer = make_store()
    good = [commit(writer, prompt_fingerprint="fp").id for _ in range(4)]
    pinned = commit(writer, pinned=True, ttl_seconds=5, prompt_fingerprint="fp").id
    expiring = commit(writer, ttl_seconds=5, prompt_fingerprint="fp").id
    corrupt_payload = commit(writer, data=b"A" * 64, prompt_fingerprint="fp").id
    bad_meta = commit(writer, prompt_fingerprint="fp").id
    other = commit(writer, principal=P2, prompt_fingerprint="fp").id
    # damage after commit: flipped byte, tampered metadata, an abandoned staging entry
    pay = state_dir(root, P1, corrupt_payload) / "payload.bin"
    pay.write_bytes(b"B" + pay.read_bytes()[1:])
    meta = state_dir(root, P1, bad_meta) / "metadata.json"
    meta.write_bytes(meta.read_bytes().replace(b"tiny-model", b"tiny-modeX"))
    (root / f"p_{P1}" / ".staging-deadbeef").mkdir()
    (root / f"p_{P1}" / ".staging-deadbeef" / "payload.bin").write_bytes(b"half")
    clock.advance(10)  # pinned and expiring are now expired

    before = snapshot(root.parent.parent)
    reader = make_store()  # a fresh instance, no caches
    ids = [*good, pinned, expiring, corrupt_payload, bad_meta, other]
    _all_reads(reader, ids)
    _all_reads(writer, ids)  # and the instance that holds caches
    assert snapshot(root.parent.parent) == before

    visible = {r.id for r in reader.list_states(P1)[0]}
    assert visible == set(good) | {corrupt_payload}  # size-correct payload is only caught on use
    assert reader.get(P1, bad_meta) is None and reader.get(P1, pinned) is None
    inv = {e.id: e for e in reader.inventory()}
    assert inv[pinned].expired and inv[pinned].pinned and inv[bad_meta].invalid
    assert inv[".staging-deadbeef"].kind == "staging" and not inv[".staging-deadbeef"].active
    assert snapshot(root.parent.parent) == before

    # the next real mutation cleans up
    writer.reconcile()
    assert staging_leftovers(root) == []
    assert not state_dir(root, P1, pinned).exists() and not state_dir(root, P1, expiring).exists()
    assert not state_dir(root, P1, bad_meta).exists()
    assert len(os.listdir(root / ".quarantine")) == 1

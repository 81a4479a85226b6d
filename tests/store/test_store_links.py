"""Planted links are never followed; nothing outside WERK_HOME is read, written or deleted."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from werk_host.errors import ErrorCode, WerkError
from werk_host.store import StateRecord, StateStore

from .helpers import P1, commit, quarantined, read_payload, snapshot, state_dir


def _valid_state_outside(tmp_path: Path, outside: Path) -> tuple[Path, StateRecord]:
    """A perfectly valid P1 state directory that lives outside WERK_HOME (bait)."""
    other_root = tmp_path / "elsewhere" / "runtime-state" / "v1"
    other = StateStore(other_root)
    rec = commit(other, data=b"bait-payload", prompt_fingerprint="fp")
    target = outside / rec.id
    shutil.move(state_dir(other_root, P1, rec.id), target)
    return target, rec


def _reads_see_nothing(store: StateStore, rec: StateRecord) -> None:
    assert store.get(P1, rec.id) is None
    assert rec.id not in {r.id for r in store.list_states(P1)[0]}
    assert store.find_by_fingerprint(P1, "fp") == []
    assert store.prune(P1, ids=[rec.id]).matched == 0
    with pytest.raises(WerkError) as err:
        read_payload(store, P1, rec.id)
    assert err.value.code is ErrorCode.NOT_FOUND


def test_principal_dir_link(store: StateStore, root: Path, tmp_path: Path, outside: Path) -> None:
    bait, rec = _valid_state_outside(tmp_path, outside)
    fake_pdir = outside / "pdir"
    fake_pdir.mkdir()
    shutil.move(bait, fake_pdir / rec.id)
    root.mkdir(parents=True)
    os.symlink(fake_pdir, root / f"p_{P1}")
    before = snapshot(outside)
    _reads_see_nothing(store, rec)
    new = commit(store, data=b"real")  # the mutation unlinks the link and makes a real directory
    assert not (root / f"p_{P1}").is_symlink()
    assert [r.id for r in store.list_states(P1)[0]] == [new.id]
    assert store.purge(everything=True).removed == 1
    assert snapshot(outside) == before
    assert (outside / "canary.txt").read_bytes() == b"do not touch"


def test_state_dir_link(store: StateStore, root: Path, tmp_path: Path, outside: Path) -> None:
    keep = commit(store)
    bait, rec = _valid_state_outside(tmp_path, outside)
    os.symlink(bait, root / f"p_{P1}" / rec.id)
    before = snapshot(outside)
    _reads_see_nothing(store, rec)
    assert store.delete(P1, rec.id) is False
    with pytest.raises(WerkError):
        store.set_pinned(P1, rec.id, True)
    assert not os.path.lexists(root / f"p_{P1}" / rec.id)  # the link itself was unlinked
    assert store.get(P1, keep.id) == keep
    assert snapshot(outside) == before


@pytest.mark.parametrize("name", ["payload.bin", "metadata.json", "metadata.sha256", "pinned"])
def test_file_links_inside_a_state(make_store: Callable[..., StateStore], root: Path, outside: Path, name: str) -> None:
    store = make_store(quarantine_limit=1)
    data = b"payload-bytes-that-would-verify"
    rec = commit(store, data=data, pinned=True)
    sdir = state_dir(root, P1, rec.id)
    # the link target holds the exact original bytes, so following it would "verify"
    target = outside / f"copy-of-{name}"
    shutil.copyfile(sdir / name, target)
    original = target.read_bytes()
    os.unlink(sdir / name)
    os.symlink(target, sdir / name)
    before = snapshot(outside)
    assert store.get(P1, rec.id) is None
    with pytest.raises(WerkError) as err:
        read_payload(store, P1, rec.id)
    assert err.value.code is ErrorCode.CORRUPT_STATE
    store.reconcile()
    assert quarantined(root) == [rec.id]
    # evict it from the bounded quarantine too: rmtree unlinks the link, not its target
    for _ in range(2):
        bad = commit(store)
        (state_dir(root, P1, bad.id) / "metadata.json").write_bytes(b"{}")
        store.reconcile()
    assert len(os.listdir(root / ".quarantine")) == 1
    assert snapshot(outside) == before
    assert target.read_bytes() == original and (outside / "canary.txt").read_bytes() == b"do not touch"


def test_quarantine_link(store: StateStore, root: Path, outside: Path) -> None:
    rec = commit(store)
    qtarget = outside / "q"
    qtarget.mkdir()
    os.symlink(qtarget, root / ".quarantine")
    (state_dir(root, P1, rec.id) / "metadata.json").write_bytes(b"{broken")
    before = snapshot(outside)
    store.reconcile()
    assert quarantined(root) == [rec.id]
    assert not (root / ".quarantine").is_symlink() and len(os.listdir(root / ".quarantine")) == 1
    assert snapshot(outside) == before


def test_root_link_is_refused(werk_home_dir: Path, tmp_path: Path, outside: Path) -> None:
    bait_root, rec = _valid_state_outside(tmp_path, outside)
    fake_root = outside / "v1"
    (fake_root / f"p_{P1}").mkdir(parents=True)
    shutil.move(bait_root, fake_root / f"p_{P1}" / rec.id)
    (werk_home_dir / "runtime-state").mkdir()
    os.symlink(fake_root, werk_home_dir / "runtime-state" / "v1")
    store = StateStore(werk_home_dir / "runtime-state" / "v1")
    before = snapshot(outside)
    _reads_see_nothing(store, rec)
    assert store.inventory() == []
    for mutate in (
        lambda: commit(store),
        lambda: store.delete(P1, rec.id),
        lambda: store.prune(P1, everything=True, dry_run=False),
        lambda: store.reconcile(),
        lambda: store.purge(everything=True),
    ):
        with pytest.raises(WerkError) as err:
            mutate()
        assert err.value.code is ErrorCode.FORBIDDEN
    assert snapshot(outside) == before
    # the same for a planted runtime-state level
    os.unlink(werk_home_dir / "runtime-state" / "v1")
    os.rmdir(werk_home_dir / "runtime-state")
    os.symlink(outside, werk_home_dir / "runtime-state")
    with pytest.raises(WerkError):
        commit(store)
    assert snapshot(outside) == before


def test_lock_and_last_accessed_links(store: StateStore, root: Path, outside: Path) -> None:
    rec = commit(store)
    canary = outside / "canary.txt"
    os.unlink(root / ".lock")
    os.symlink(canary, root / ".lock")
    os.symlink(canary, state_dir(root, P1, rec.id) / "last-accessed")
    before = snapshot(outside)
    # use replaces the last-accessed link instead of writing through it
    assert read_payload(store, P1, rec.id) == b"state-bytes"
    assert not (state_dir(root, P1, rec.id) / "last-accessed").is_symlink()
    commit(store)  # the mutation replaces the planted lock link with a real lock file
    assert (root / ".lock").is_file() and not (root / ".lock").is_symlink()
    assert snapshot(outside) == before and canary.read_bytes() == b"do not touch"


def test_fifo_does_not_block_reads(store: StateStore, root: Path) -> None:
    rec = commit(store)
    meta = state_dir(root, P1, rec.id) / "metadata.json"
    meta.unlink()
    os.mkfifo(meta)
    t0 = time.monotonic()
    fresh = StateStore(root)
    assert fresh.get(P1, rec.id) is None
    assert fresh.list_states(P1) == ([], None)
    assert time.monotonic() - t0 < 5
    store.reconcile()
    assert quarantined(root) == [rec.id]

"""Damaged states are never trusted: corrupt_state on use, quarantine on the next mutation."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from werk_host.errors import ErrorCode, WerkError
from werk_host.store import StateStore

from .helpers import P1, commit, payload_for, quarantined, read_payload, snapshot, state_dir


def _expect_corrupt(store: StateStore, sid: str) -> None:
    with pytest.raises(WerkError) as err:
        read_payload(store, P1, sid)
    assert err.value.code is ErrorCode.CORRUPT_STATE
    assert err.value.public_message() == "stored state failed integrity validation"


def _flip_payload(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def _tamper_meta(path: Path) -> None:
    path.write_bytes(path.read_bytes().replace(b'"backend":"llamacpp"', b'"backend":"llamacpX"'))


def _tamper_checksum(path: Path) -> None:
    text = path.read_text()
    path.write_text(("0" if text[0] != "0" else "1") + text[1:])


DAMAGE: dict[str, tuple[str, Callable[[Path], object]]] = {
    "flipped payload byte": ("payload.bin", _flip_payload),
    "tampered metadata.json": ("metadata.json", _tamper_meta),
    "tampered metadata.sha256": ("metadata.sha256", _tamper_checksum),
    "truncated payload": ("payload.bin", lambda p: p.write_bytes(p.read_bytes()[:-1])),
    "missing payload": ("payload.bin", lambda p: p.unlink()),
    "unparseable metadata": ("metadata.json", lambda p: p.write_bytes(b"{not json")),
}


@pytest.mark.parametrize("case", sorted(DAMAGE))
@pytest.mark.parametrize("fresh_process_view", [False, True])
def test_damage_is_detected_and_quarantined(
    make_store: Callable[..., StateStore], root: Path, case: str, fresh_process_view: bool
) -> None:
    store = make_store()
    victim_data = payload_for(1, 200_000)
    victim = commit(store, data=victim_data)
    others = [commit(store, data=payload_for(i, 1000 + i)) for i in range(2, 5)]
    others_before = {r.id: snapshot(state_dir(root, P1, r.id)) for r in others}
    name, damage = DAMAGE[case]
    damage(state_dir(root, P1, victim.id) / name)

    user = make_store() if fresh_process_view else store
    _expect_corrupt(user, victim.id)
    _expect_corrupt(user, victim.id)  # still corrupt, still not trusted
    assert victim.id not in {r.id for r in user.list_states(P1)[0]}
    assert user.get(P1, victim.id) is None

    # the next real mutation (here: an unrelated commit) quarantines it
    commit(user, data=b"unrelated")
    assert not state_dir(root, P1, victim.id).exists()
    quarantined = os.listdir(root / ".quarantine")
    assert len(quarantined) == 1 and quarantined[0].endswith(victim.id)
    assert os.stat(root / ".quarantine").st_mode & 0o777 == 0o700
    with pytest.raises(WerkError) as err:
        read_payload(user, P1, victim.id)
    assert err.value.code is ErrorCode.NOT_FOUND

    # nothing else affected
    for rec in others:
        assert snapshot(state_dir(root, P1, rec.id)) == others_before[rec.id]
        assert user.get(P1, rec.id) == rec
        assert read_payload(user, P1, rec.id) == payload_for(int(rec.bytes or 0) - 1000, int(rec.bytes or 0))


def test_corrupt_payload_detected_before_any_byte_is_read(store: StateStore, root: Path) -> None:
    rec = commit(store, data=payload_for(9, 50_000))
    _flip_payload(state_dir(root, P1, rec.id) / "payload.bin")
    with pytest.raises(WerkError) as err, store.open_payload(P1, rec.id):
        pytest.fail("a corrupt payload must not be yielded")
    assert err.value.code is ErrorCode.CORRUPT_STATE
    assert not (state_dir(root, P1, rec.id) / "last-accessed").exists()
    store.reconcile()
    assert not state_dir(root, P1, rec.id).exists()


def test_tamper_found_by_fresh_reconcile_without_prior_use(make_store: Callable[..., StateStore], root: Path) -> None:
    store = make_store()
    rec = commit(store)
    keep = commit(store)
    _tamper_meta(state_dir(root, P1, rec.id) / "metadata.json")
    make_store().reconcile()
    assert quarantined(root) == [rec.id]
    assert store.get(P1, keep.id) == keep
    # the same process's store also notices via its rotating audit
    rec2 = commit(store)
    _tamper_checksum(state_dir(root, P1, rec2.id) / "metadata.sha256")
    store.reconcile()
    assert quarantined(root) == sorted([rec.id, rec2.id])


def test_quarantine_retention_is_bounded(make_store: Callable[..., StateStore], root: Path) -> None:
    store = make_store(quarantine_limit=3)
    for _ in range(5):
        rec = commit(store)
        _tamper_meta(state_dir(root, P1, rec.id) / "metadata.json")
        store.reconcile()
    assert len(os.listdir(root / ".quarantine")) == 3
    zero = make_store(quarantine_limit=0)
    rec = commit(zero)
    _tamper_meta(state_dir(root, P1, rec.id) / "metadata.json")
    zero.reconcile()
    assert not state_dir(root, P1, rec.id).exists()
    assert len(os.listdir(root / ".quarantine")) == 0


def test_uninspectable_entries_are_deleted(store: StateStore, root: Path) -> None:
    rec, crowded, odd = commit(store), commit(store), commit(store)
    (state_dir(root, P1, rec.id) / "deep" / "deeper").mkdir(parents=True)
    for i in range(40):
        (state_dir(root, P1, crowded.id) / f"junk{i}").write_bytes(b"")
    (state_dir(root, P1, odd.id) / "unexpected").write_bytes(b"?")
    store.reconcile()
    assert quarantined(root) == [odd.id]  # the two uninspectable ones are deleted outright
    assert not state_dir(root, P1, rec.id).exists() and not state_dir(root, P1, crowded.id).exists()
    assert not state_dir(root, P1, odd.id).exists()


def test_stray_directories_and_files_in_namespace(store: StateStore, root: Path) -> None:
    keep = commit(store)
    pdir = root / f"p_{P1}"
    (pdir / "not-a-state").mkdir()
    (pdir / "stray-file").write_bytes(b"x")
    (root / "stray-root-file").write_bytes(b"x")
    store.reconcile()
    assert quarantined(root) == ["not-a-state"]
    assert not (root / "stray-root-file").exists()
    assert sorted(os.listdir(pdir)) == [keep.id]
    assert store.get(P1, keep.id) == keep

"""``StateStore.verify``: integrity before reuse, quarantine on mismatch, a bounded stat-keyed cache."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from werk_host.errors import ErrorCode, WerkError
from werk_host.store import StateStore
from werk_host.store import layout as store_layout
from werk_host.store import verify as store_verify

from .helpers import P1, P2, FakeClock, commit, payload_for, read_payload, state_dir


def _flip_in_place(path: Path) -> None:
    """Invert one byte in the middle of ``path`` without changing its inode or size."""
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.seek(size // 2)
        byte = f.read(1)
        f.seek(size // 2)
        f.write(bytes([byte[0] ^ 0xFF]))


@pytest.fixture
def hashed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Sizes of every payload the store hashes from disk (commit hashes while streaming)."""
    calls: list[int] = []
    real = store_layout.hash_fd

    def counting(fd: int, expected_size: int) -> tuple[str, int]:
        calls.append(expected_size)
        return real(fd, expected_size)

    monkeypatch.setattr(store_layout, "hash_fd", counting)
    return calls


@pytest.fixture
def no_racy_margin(monkeypatch: pytest.MonkeyPatch) -> None:
    """Trust timestamps at once instead of waiting out the racy-timestamp margin."""
    monkeypatch.setattr(store_layout, "RACY_MARGIN_NS", 0)


def _touch(path: Path) -> None:
    """A new mtime and ctime: the commit's remembered digest no longer applies."""
    os.utime(path)


def _quarantined(root: Path) -> list[str]:
    qdir = root / ".quarantine"
    return sorted(n.rsplit("-", 1)[1] for n in os.listdir(qdir)) if qdir.exists() else []


def test_intact_payload_verifies(store: StateStore) -> None:
    rec = commit(store, data=payload_for(1, 300_000))
    assert store.verify(P1, rec.id) is True
    assert read_payload(store, P1, rec.id) == payload_for(1, 300_000)


@pytest.mark.parametrize("fresh_view", [False, True])
def test_flipped_byte_fails_and_is_quarantined_at_once(
    make_store: Callable[..., StateStore], root: Path, fresh_view: bool
) -> None:
    store = make_store()
    victim = commit(store, data=payload_for(2, 100_000))
    keep = commit(store, data=payload_for(3, 1000))
    _flip_in_place(state_dir(root, P1, victim.id) / "payload.bin")
    user = make_store() if fresh_view else store
    assert user.verify(P1, victim.id) is False
    # quarantined by the call itself, not only hidden: another store (process) sees it gone too
    assert not state_dir(root, P1, victim.id).exists()
    assert _quarantined(root) == [victim.id]
    assert make_store().get(P1, victim.id) is None
    assert [r.id for r in make_store().list_states(P1)[0]] == [keep.id]
    with pytest.raises(WerkError) as err:
        user.verify(P1, victim.id)
    assert err.value.code is ErrorCode.NOT_FOUND
    assert user.verify(P1, keep.id) is True


def test_tampered_metadata_fails_and_is_quarantined(store: StateStore, root: Path) -> None:
    rec = commit(store)
    meta = state_dir(root, P1, rec.id) / "metadata.json"
    meta.write_bytes(meta.read_bytes().replace(b'"backend":"llamacpp"', b'"backend":"llamacpX"'))
    assert store.verify(P1, rec.id) is False
    assert _quarantined(root) == [rec.id]


def test_absent_expired_and_foreign_ids_are_not_found(store: StateStore, clock: FakeClock) -> None:
    rec = commit(store, ttl_seconds=5)
    for principal, sid in ((P1, "st_" + "0" * 32), (P2, rec.id), (P1, "not-an-id")):
        with pytest.raises(WerkError) as err:
            store.verify(principal, sid)
        assert err.value.code is ErrorCode.NOT_FOUND
    clock.advance(6)
    with pytest.raises(WerkError) as err:
        store.verify(P1, rec.id)
    assert err.value.code is ErrorCode.NOT_FOUND


@pytest.mark.usefixtures("no_racy_margin")
def test_unchanged_file_is_hashed_once_and_any_change_rehashes(
    store: StateStore, root: Path, hashed: list[int]
) -> None:
    rec = commit(store, data=payload_for(4, 50_000))
    assert store.verify(P1, rec.id) and store.verify(P1, rec.id) and store.verify(P1, rec.id)
    assert hashed == []  # the commit hashed the bytes as it wrote them and remembered that
    payload = state_dir(root, P1, rec.id) / "payload.bin"
    st = payload.stat()
    os.utime(payload, ns=(st.st_atime_ns, st.st_mtime_ns))  # same mtime, but a new ctime
    assert payload.stat().st_mtime_ns == st.st_mtime_ns and payload.stat().st_ctime_ns != st.st_ctime_ns
    assert store.verify(P1, rec.id) and store.verify(P1, rec.id)
    assert len(hashed) == 1
    _flip_in_place(payload)
    assert store.verify(P1, rec.id) is False
    assert len(hashed) >= 2  # the verifier hashed again (reconciliation's deep inspection may too)


def test_a_write_right_after_the_commit_is_never_hidden_by_its_remembered_digest(store: StateStore, root: Path) -> None:
    """The commit pins the payload's mtime seconds in the past, so even a write in the same
    timestamp tick moves it and the remembered digest no longer applies."""
    before = time.time_ns()
    rec = commit(store, data=payload_for(7, 80_000))
    payload = state_dir(root, P1, rec.id) / "payload.bin"
    mtime = payload.stat().st_mtime_ns
    assert mtime <= before - 1_000_000_000
    _flip_in_place(payload)  # at once: the same second, most likely the same tick
    assert payload.stat().st_mtime_ns != mtime
    assert store.verify(P1, rec.id) is False
    assert _quarantined(root) == [rec.id]


def test_recently_changed_file_is_not_remembered(
    store: StateStore, root: Path, hashed: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Within the racy margin a same-timestamp rewrite could go unseen: hash every time."""
    monkeypatch.setattr(store_layout, "RACY_MARGIN_NS", 3600 * 10**9)
    rec = commit(store)
    _touch(state_dir(root, P1, rec.id) / "payload.bin")
    assert store.verify(P1, rec.id) and store.verify(P1, rec.id)
    assert len(hashed) == 2


@pytest.mark.usefixtures("no_racy_margin")
def test_cache_is_bounded_least_recently_used_first(
    store: StateStore, root: Path, hashed: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_verify, "MAX_VERIFIED_CACHE", 2)
    a, b, c = (commit(store, data=payload_for(i, 1000 + i)) for i in range(3))
    for rec in (a, b, c):
        _touch(state_dir(root, P1, rec.id) / "payload.bin")
    for rec in (a, b, a, c):  # c evicts b, the least recently used
        assert store.verify(P1, rec.id)
    assert len(hashed) == 3
    for rec in (a, b, c):  # the in-memory bound alone: no durable receipts
        (state_dir(root, P1, rec.id) / "verified").unlink()
    assert store.verify(P1, a.id) and store.verify(P1, c.id)
    assert len(hashed) == 3
    assert store.verify(P1, b.id)
    assert len(hashed) == 4


@pytest.mark.usefixtures("no_racy_margin")
def test_concurrent_verifications_agree(store: StateStore, root: Path) -> None:
    good = commit(store, data=payload_for(5, 200_000))
    bad = commit(store, data=payload_for(6, 200_000))
    _flip_in_place(state_dir(root, P1, bad.id) / "payload.bin")
    results: list[tuple[str, bool | str]] = []
    lock = threading.Lock()

    def worker(sid: str) -> None:
        try:
            got: bool | str = store.verify(P1, sid)
        except WerkError as exc:
            got = exc.code.value
        with lock:
            results.append((sid, got))

    threads = [threading.Thread(target=worker, args=(sid,)) for sid in [good.id, bad.id] * 8]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {got for sid, got in results if sid == good.id} == {True}
    # every caller saw the corruption: as a failed verification, or as already quarantined
    assert {got for sid, got in results if sid == bad.id} <= {False, "not_found"}
    assert False in {got for sid, got in results if sid == bad.id}
    assert _quarantined(root) == [bad.id]


@pytest.mark.usefixtures("no_racy_margin")
def test_a_receipt_spares_a_later_process_the_hash_of_the_same_unchanged_file(
    store: StateStore, make_store: Callable[..., StateStore], root: Path, hashed: list[int]
) -> None:
    rec = commit(store, data=payload_for(9, 70_000))  # hashed while written: its receipt is written too
    later = make_store()  # another process: nothing remembered in memory
    assert later.verify(P1, rec.id) and read_payload(later, P1, rec.id) == payload_for(9, 70_000)
    assert hashed == []
    _touch(state_dir(root, P1, rec.id) / "payload.bin")  # a new payload key: the receipt no longer applies
    assert make_store().verify(P1, rec.id)
    assert len(hashed) == 1  # hashed again, and a new receipt recorded for the touched file
    assert make_store().verify(P1, rec.id) and len(hashed) == 1
    _flip_in_place(state_dir(root, P1, rec.id) / "payload.bin")
    assert make_store().verify(P1, rec.id) is False  # a write changes the key: hashed and refused
    assert _quarantined(root) == [rec.id]


@pytest.mark.usefixtures("no_racy_margin")
def test_a_forged_or_foreign_receipt_vouches_for_nothing(
    store: StateStore, make_store: Callable[..., StateStore], root: Path, hashed: list[int]
) -> None:
    a, b = commit(store, data=payload_for(1, 5000)), commit(store, data=payload_for(2, 5000))
    receipt_b = (state_dir(root, P1, b.id) / "verified").read_bytes()
    (state_dir(root, P1, a.id) / "verified").write_bytes(receipt_b)  # another file's key and digest
    assert make_store().verify(P1, a.id) and len(hashed) == 1
    (state_dir(root, P1, b.id) / "verified").write_bytes(b"{not json")
    assert make_store().verify(P1, b.id) and len(hashed) == 2

"""Commit, lookup, paging, payload use and input validation of the runtime-state store."""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from werk_host.errors import ErrorCode, WerkError
from werk_host.store import StateStore

from .helpers import ENV, P1, FakeClock, commit, payload_for, read_payload, staging_leftovers, state_dir


def test_constructing_creates_nothing(werk_home_dir: Path, root: Path) -> None:
    StateStore(root)
    assert list(werk_home_dir.iterdir()) == []


def test_commit_layout_and_permissions(store: StateStore, root: Path, clock: FakeClock) -> None:
    data = payload_for(1, 3 * (1 << 20) + 17)  # several streaming chunks
    rec = commit(store, data=data, prompt_fingerprint="fp", prompt_tokens=12, adapter_meta={"n_tokens": 12})
    assert rec.id.startswith("st_") and len(rec.id) == 35
    assert rec.bytes == len(data)
    assert rec.payload_sha256 == hashlib.sha256(data).hexdigest()
    assert rec.tier == "disk" and not rec.pinned and rec.expires_unix_ms is None
    assert rec.created_unix_ms == int(clock.now * 1000) == rec.last_accessed_unix_ms

    sdir = state_dir(root, P1, rec.id)
    assert sorted(os.listdir(sdir)) == ["metadata.json", "metadata.sha256", "payload.bin", "verified"]
    assert sorted(os.listdir(root)) == [".lock", f"p_{P1}"]
    meta = (sdir / "metadata.json").read_bytes()
    assert (sdir / "metadata.sha256").read_bytes().decode() == hashlib.sha256(meta).hexdigest()
    doc = json.loads(meta)
    assert doc["id"] == rec.id and doc["principal"] == P1 and doc["envelope"] == ENV
    for path in (root, root.parent, root / f"p_{P1}", sdir):
        assert stat.S_IMODE(os.lstat(path).st_mode) == 0o700
    for name in ("metadata.json", "metadata.sha256", "payload.bin", "verified", "../../.lock"):
        assert stat.S_IMODE(os.lstat(sdir / name).st_mode) == 0o600
    assert store.get(P1, rec.id) == rec
    assert read_payload(store, P1, rec.id) == data


def test_ids_are_random_not_prompt_derived(store: StateStore) -> None:
    a = commit(store, prompt_fingerprint="same")
    b = commit(store, prompt_fingerprint="same")
    assert a.id != b.id


def test_iterable_payload_and_expected_sha(store: StateStore) -> None:
    chunks: list[bytes | bytearray | memoryview] = [b"abc", bytearray(b"def"), memoryview(b"ghi")]
    want = hashlib.sha256(b"abcdefghi").hexdigest()
    rec = store.commit(P1, model_id="m", backend="b", compat_key={}, payload=iter(chunks), expected_sha256=want)
    assert rec.bytes == 9 and rec.payload_sha256 == want


def test_expected_sha_mismatch_publishes_nothing(store: StateStore, root: Path) -> None:
    with pytest.raises(WerkError) as err:
        commit(store, data=b"x" * 100, expected_sha256="0" * 64)
    assert err.value.code is ErrorCode.CORRUPT_STATE
    assert store.list_states(P1) == ([], None)
    assert os.listdir(root / f"p_{P1}") == []


def test_payload_bound_enforced_while_streaming(make_store: Callable[..., StateStore], root: Path) -> None:
    store = make_store(max_payload_bytes=1000)
    produced = 0

    def gen() -> Iterator[bytes]:
        nonlocal produced
        for _ in range(100):
            produced += 1
            yield b"y" * 100

    with pytest.raises(WerkError) as err:
        store.commit(P1, model_id="m", backend="b", compat_key={}, payload=gen())
    assert err.value.code is ErrorCode.RESOURCE_EXHAUSTED
    assert produced == 11  # stopped at the first chunk over the bound, not after buffering all
    assert store.list_states(P1) == ([], None)
    assert staging_leftovers(root) == []
    assert commit(store, data=b"z" * 1000).bytes == 1000


def test_failing_source_leaves_nothing(store: StateStore, root: Path) -> None:
    def gen() -> Iterator[bytes]:
        yield b"partial"
        raise RuntimeError("backend died")

    with pytest.raises(RuntimeError):
        store.commit(P1, model_id="m", backend="b", compat_key={}, payload=gen())
    assert staging_leftovers(root) == []
    assert store.list_states(P1) == ([], None)


@pytest.mark.parametrize(
    "kw",
    [
        {"model_id": ""},
        {"compat_key": {"k": 1}},
        {"ttl_seconds": 0},
        {"ttl_seconds": 2_592_001},
        {"prompt_tokens": -1},
        {"adapter_meta": {"x": object()}},
        {"adapter_meta": {"x": "y" * 20_000}},
        {"expected_sha256": "XYZ"},
    ],
)
def test_commit_validation(store: StateStore, werk_home_dir: Path, kw: dict[str, object]) -> None:
    with pytest.raises(WerkError) as err:
        commit(store, **kw)  # type: ignore[arg-type]
    assert err.value.code is ErrorCode.INVALID_REQUEST
    assert list(werk_home_dir.iterdir()) == []  # rejected before anything is created


def test_bad_principal_rejected(store: StateStore) -> None:
    for bad in ("", "ABCD", "../x", "a" * 129, "key sk-werk"):
        with pytest.raises(WerkError):
            store.get(bad, "st_" + "0" * 32)


def test_list_pagination_ordered_by_id(store: StateStore) -> None:
    ids = sorted(commit(store, model_id="m1" if i % 2 else "m2").id for i in range(25))
    seen: list[str] = []
    after = None
    while True:
        page, after = store.list_states(P1, limit=7, after=after)
        seen += [r.id for r in page]
        if after is None:
            break
        assert len(page) == 7
    assert seen == ids
    full, nxt = store.list_states(P1, limit=25)
    assert [r.id for r in full] == ids and nxt is None
    m1, _ = store.list_states(P1, model_id="m1", limit=100)
    assert len(m1) == 12 and all(r.model_id == "m1" for r in m1)
    assert store.list_states(P1, tier="ram") == ([], None)
    assert len(store.list_states(P1, tier="disk")[0]) == 25


@pytest.mark.parametrize("kw", [{"limit": 0}, {"limit": 101}, {"after": "forged"}, {"tier": "tape"}])
def test_list_rejects_bad_arguments(store: StateStore, kw: dict[str, object]) -> None:
    with pytest.raises(WerkError) as err:
        store.list_states(P1, **kw)  # type: ignore[arg-type]
    assert err.value.code is ErrorCode.INVALID_REQUEST


def test_list_sees_commits_from_another_store_instance(make_store: Callable[..., StateStore]) -> None:
    reader, writer = make_store(), make_store()
    assert reader.list_states(P1) == ([], None)
    a = commit(writer)
    assert [r.id for r in reader.list_states(P1)[0]] == [a.id]
    b = commit(writer)
    assert [r.id for r in reader.list_states(P1)[0]] == sorted([a.id, b.id])
    writer.delete(P1, a.id)
    assert [r.id for r in reader.list_states(P1)[0]] == [b.id]


def test_find_by_fingerprint(store: StateStore) -> None:
    a = commit(store, prompt_fingerprint="fp-a")
    commit(store, prompt_fingerprint="fp-b")
    c = commit(store, prompt_fingerprint="fp-a")
    assert [r.id for r in store.find_by_fingerprint(P1, "fp-a")] == sorted([a.id, c.id])
    store.delete(P1, a.id)
    assert [r.id for r in store.find_by_fingerprint(P1, "fp-a")] == [c.id]
    assert store.find_by_fingerprint(P1, "nope") == []


def test_open_payload_records_last_accessed(store: StateStore, root: Path, clock: FakeClock) -> None:
    rec = commit(store, data=b"abc")
    clock.advance(5)
    assert read_payload(store, P1, rec.id) == b"abc"
    la = state_dir(root, P1, rec.id) / "last-accessed"
    assert la.read_text() == str(int(clock.now * 1000))
    assert stat.S_IMODE(os.lstat(la).st_mode) == 0o600
    got = store.get(P1, rec.id)
    assert got is not None and got.last_accessed_unix_ms == int(clock.now * 1000)


def test_open_payload_failure_inside_block_records_nothing(store: StateStore, root: Path) -> None:
    rec = commit(store)
    with pytest.raises(ValueError), store.open_payload(P1, rec.id):
        raise ValueError("load failed")
    assert not (state_dir(root, P1, rec.id) / "last-accessed").exists()


def test_open_payload_reads_a_multi_chunk_payload_whole(store: StateStore) -> None:
    data = payload_for(7, (1 << 20) + 5)  # one byte more than a hashing chunk, plus a few
    rec = commit(store, data=data)
    assert read_payload(store, P1, rec.id) == data
    assert read_payload(store, P1, rec.id) == data  # reading twice changes nothing


def test_set_pinned_and_delete(store: StateStore, root: Path) -> None:
    rec = commit(store)
    pinned = store.set_pinned(P1, rec.id, True)
    assert pinned.pinned and (state_dir(root, P1, rec.id) / "pinned").is_file()
    got = store.get(P1, rec.id)
    assert got is not None and got.pinned
    assert not store.set_pinned(P1, rec.id, False).pinned
    assert not (state_dir(root, P1, rec.id) / "pinned").exists()
    assert store.delete(P1, rec.id) is True
    assert store.delete(P1, rec.id) is False
    assert store.get(P1, rec.id) is None
    with pytest.raises(WerkError) as err:
        store.set_pinned(P1, rec.id, True)
    assert err.value.code is ErrorCode.NOT_FOUND
    with pytest.raises(WerkError) as err:
        read_payload(store, P1, rec.id)
    assert err.value.code is ErrorCode.NOT_FOUND


def test_mutations_on_absent_root_create_nothing(store: StateStore, werk_home_dir: Path) -> None:
    sid = "st_" + "0" * 32
    assert store.delete(P1, sid) is False
    with pytest.raises(WerkError):
        store.set_pinned(P1, sid, True)
    assert store.prune(P1, everything=True, dry_run=False).matched == 0
    store.reconcile()
    assert store.purge(everything=True).removed == 0
    assert list(werk_home_dir.iterdir()) == []


def test_prune_selectors(store: StateStore, clock: FakeClock) -> None:
    old = commit(store, model_id="m1")
    clock.advance(10)
    cut = int(clock.now * 1000)
    new = commit(store, model_id="m2", data=b"1234")
    pinned = commit(store, model_id="m2", pinned=True)
    with pytest.raises(WerkError):
        store.prune(P1)  # no selector
    with pytest.raises(WerkError):
        store.prune(P1, ids=[old.id], everything=True)  # two selectors
    with pytest.raises(WerkError):
        store.prune(P1, ids=[old.id, old.id])
    with pytest.raises(WerkError):
        store.prune(P1, ids=[])
    assert store.prune(P1, older_than_unix_ms=cut).matched == 1
    preview = store.prune(P1, model_id="m2")
    assert (preview.matched, preview.removed, preview.dry_run) == (2, 0, True)
    assert preview.bytes == 4 + (pinned.bytes or 0)
    assert store.prune(P1, model_id="m2", skip_pinned=True, dry_run=False).removed == 1
    assert store.get(P1, new.id) is None and store.get(P1, pinned.id) is not None
    out = store.prune(P1, ids=[old.id, "st_" + "f" * 32, "bogus"], dry_run=False)
    assert (out.matched, out.removed) == (1, 1)
    assert store.prune(P1, everything=True, dry_run=False).removed == 1
    assert store.list_states(P1) == ([], None)


def test_concurrent_threads_commit_and_list(store: StateStore) -> None:
    import threading

    errors: list[BaseException] = []
    made: list[str] = []

    def worker() -> None:
        try:
            for _ in range(10):
                made.append(commit(store, data=os.urandom(64)).id)
                store.list_states(P1)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sorted(made) == [r.id for r in store.list_states(P1, limit=100)[0]]


def test_readinto_source(store: StateStore) -> None:
    data = payload_for(3, 2_500_000)
    rec = store.commit(P1, model_id="m", backend="b", compat_key={}, payload=io.BufferedReader(io.BytesIO(data)))
    assert read_payload(store, P1, rec.id) == data

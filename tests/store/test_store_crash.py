"""Crash safety under SIGKILL and multi-process concurrency, with real processes and files."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

from werk_host.store import StateRecord, StateStore

from .crashkit import all_ids, go, parse_acks, run_store_kills, spawn, unclean_entries
from .helpers import P1, P2, payload_for, read_payload, staging_leftovers

KILLS = int(os.environ.get("WERK_STORE_CRASH_KILLS", "300"))


def _verify(store: StateStore, principal: str, sid: str, expect: tuple[int, int] | None = None) -> None:
    rec = store.get(principal, sid)
    assert rec is not None, sid
    seed, size = expect if expect is not None else (rec.adapter_meta["seed"], rec.adapter_meta["size"])
    assert rec.bytes == size
    assert read_payload(store, principal, sid) == payload_for(seed, size)


def test_sigkill_during_commits_loses_no_acknowledged_state(tmp_path: Path) -> None:
    root = tmp_path / "home" / "runtime-state" / "v1"
    ackdir = tmp_path / "acks"
    ackdir.mkdir()
    stats = run_store_kills(root, P1, KILLS, random.Random(20240601), ackdir)
    print(f"\ncrash test: {stats.kills} SIGKILLs, {stats.live} live states, {stats.mid_commit} landed mid-commit")
    print(f"crash test: {stats.torn_publish} published-but-unacknowledged commits verified, {stats.seconds:.1f}s")
    assert stats.kills == KILLS and stats.acked > 0
    assert stats.lost == set(), f"acknowledged commits lost: {sorted(stats.lost)[:3]}"
    assert stats.corrupt == set(), f"corrupt states visible: {sorted(stats.corrupt)[:3]}"
    assert stats.unclean == set(), f"left behind after reconciliation: {sorted(stats.unclean)[:3]}"
    assert stats.mid_commit > 0  # the kills really landed inside commits


def test_two_processes_commit_concurrently_lose_nothing(tmp_path: Path) -> None:
    root = tmp_path / "home" / "runtime-state" / "v1"
    writers = [spawn(root, P1, 1, "count:25"), spawn(root, P1, 2, "count:25"), spawn(root, P2, 3, "count:15")]
    janitor = spawn(root, P1, 4, "reconcile:3")  # reconciling concurrently must not touch live staging
    for proc in [*writers, janitor]:
        go(proc)
    acked: dict[str, dict[str, tuple[int, int]]] = {P1: {}, P2: {}}
    for proc, principal in zip(writers, (P1, P1, P2), strict=True):
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode()[-2000:]
        acked[principal].update(parse_acks(out))
    _out, err = janitor.communicate(timeout=120)
    assert janitor.returncode == 0, err.decode()[-2000:]
    assert len(acked[P1]) == 50 and len(acked[P2]) == 15
    store = StateStore(root)
    for principal in (P1, P2):
        assert set(all_ids(store, principal)) == set(acked[principal])
        for sid, expect in acked[principal].items():
            _verify(store, principal, sid, expect)
    store.reconcile(full=True)
    assert unclean_entries(root, P1) == set()


def test_live_commit_in_another_process_is_not_reaped_and_does_not_block(tmp_path: Path) -> None:
    """The catalog lock is not held while a payload streams; its staging entry stays live."""
    root = tmp_path / "home" / "runtime-state" / "v1"
    store = StateStore(root)
    other = commit_one(store)
    slow = go(spawn(root, P1, 77, "slow"))
    assert slow.stdout is not None and slow.stdin is not None
    assert slow.stdout.readline() == b"streaming\n"  # mid-stream, staging entry exists
    assert len(staging_leftovers(root)) == 1
    staging = [e for e in store.inventory() if e.kind == "staging"]
    assert len(staging) == 1 and staging[0].active
    t0 = time.monotonic()
    store.reconcile(full=True)  # neither blocks on nor removes the live staging entry
    assert len(staging_leftovers(root)) == 1
    assert store.purge(everything=True).removed == 1  # 'other'; the live commit is untouched
    third = commit_one(store)
    assert time.monotonic() - t0 < 10
    slow.stdin.write(b"go on\n")
    slow.stdin.flush()
    out, err = slow.communicate(timeout=60)
    assert slow.returncode == 0, err.decode()[-2000:]
    acks = parse_acks(out)
    assert len(acks) == 1
    ((sid, expect),) = acks.items()
    _verify(StateStore(root), P1, sid, expect)
    assert set(all_ids(store, P1)) == {sid, third.id} and other.id not in all_ids(store, P1)
    assert staging_leftovers(root) == []


def commit_one(store: StateStore) -> StateRecord:
    return store.commit(P1, model_id="m", backend="b", compat_key={}, payload=iter([b"x" * 10]))

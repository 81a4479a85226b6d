"""Crash safety under SIGKILL and multi-process concurrency, with real processes and files."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from werk_host.store import StateRecord, StateStore

from .helpers import P1, P2, payload_for, read_payload, staging_leftovers

CHILD = Path(__file__).with_name("_crash_child.py")
KILLS = int(os.environ.get("WERK_STORE_CRASH_KILLS", "300"))


def _spawn(root: Path, principal: str, seed: int, mode: str) -> subprocess.Popen[bytes]:
    """Start a child; it imports everything, then waits for :func:`_go`."""
    return subprocess.Popen(
        [sys.executable, str(CHILD), str(root), principal, str(seed), mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=CHILD.parent,
    )


def _go(proc: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
    assert proc.stdout is not None and proc.stdin is not None
    assert proc.stdout.readline() == b"ready\n"
    proc.stdin.write(b"go\n")
    proc.stdin.flush()
    return proc


def _acks(raw: bytes) -> dict[str, tuple[int, int]]:
    """Only complete lines count: a torn last line was never acknowledged."""
    out: dict[str, tuple[int, int]] = {}
    for line in raw.split(b"\n")[:-1]:
        tag, sid, seed, size = line.decode().split()
        assert tag == "ack"
        out[sid] = (int(seed), int(size))
    return out


def _all_ids(store: StateStore, principal: str) -> list[str]:
    ids: list[str] = []
    after = None
    while True:
        page, after = store.list(principal, limit=100, after=after)
        ids += [r.id for r in page]
        if after is None:
            return ids


def _verify(store: StateStore, principal: str, sid: str, expect: tuple[int, int] | None = None) -> None:
    rec = store.get(principal, sid)
    assert rec is not None, sid
    seed, size = expect if expect is not None else (rec.adapter_meta["seed"], rec.adapter_meta["size"])
    assert rec.bytes == size
    assert read_payload(store, principal, sid) == payload_for(seed, size)


def _no_leftovers(root: Path) -> None:
    assert staging_leftovers(root) == []
    for sdir in (root / f"p_{P1}").iterdir():
        assert not [n for n in os.listdir(sdir) if n.startswith(".tmp-")]
    quarantine = root / ".quarantine"
    assert not quarantine.exists() or os.listdir(quarantine) == []  # nothing partial was ever published


class _Zygote:
    """A pre-imported parent that forks one committing child per round."""

    def __init__(self, root: Path, principal: str, ackdir: Path) -> None:
        self.ackdir = ackdir
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILD), "zygote", str(root), principal, str(ackdir)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=CHILD.parent,
        )

    def _line(self) -> list[str]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode()
        assert line, "zygote died"
        return line.split()

    def kill_after(self, seed: int, delay: float) -> bytes:
        """Fork a committing child, SIGKILL it after ``delay`` seconds, return its acks."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"fork {seed}\n".encode())
        self.proc.stdin.flush()
        tag, pid = self._line()
        assert tag == "pid"
        time.sleep(delay)
        os.kill(int(pid), signal.SIGKILL)
        tag, dead, status = self._line()
        assert (tag, dead) == ("exit", pid)
        code = int(status)
        assert os.WIFSIGNALED(code) and os.WTERMSIG(code) == signal.SIGKILL, "child failed before the kill"
        path = self.ackdir / f"{seed}.acks"
        return path.read_bytes() if path.exists() else b""

    def close(self) -> None:
        _out, err = self.proc.communicate(input=b"", timeout=30)
        assert self.proc.returncode == 0, err.decode()[-2000:]


def test_sigkill_during_commits_loses_no_acknowledged_state(tmp_path: Path) -> None:
    root = tmp_path / "home" / "runtime-state" / "v1"
    ackdir = tmp_path / "acks"
    ackdir.mkdir()
    rng = random.Random(20240601)
    acked: dict[str, tuple[int, int]] = {}
    kills = leftovers_seen = torn_publish = 0
    started = time.monotonic()
    zygote = _Zygote(root, P1, ackdir)
    while kills < KILLS:
        delay = rng.uniform(0.005, 0.060)
        if kills % 10 == 9:  # every tenth round: a whole fresh interpreter, killed the same way
            proc = _go(_spawn(root, P1, kills + 1, "loop"))
            time.sleep(delay)
            proc.send_signal(signal.SIGKILL)
            out, err = proc.communicate()
            assert proc.returncode == -signal.SIGKILL, err.decode()[-2000:]
        else:
            out = zygote.kill_after(kills + 1, delay)
        kills += 1
        new = _acks(out)
        acked.update(new)

        fresh = StateStore(root)  # a fresh view: no caches from before the kill
        visible = set(_all_ids(fresh, P1))
        missing = set(acked) - visible
        assert not missing, f"acknowledged commits lost after kill {kills}: {sorted(missing)[:3]}"
        for sid, expect in new.items():
            _verify(fresh, P1, sid, expect)
        for sid in visible - set(acked):  # published, but killed before the ack was written
            _verify(fresh, P1, sid)
            rec = fresh.get(P1, sid)
            assert rec is not None
            acked[sid] = (rec.adapter_meta["seed"], rec.adapter_meta["size"])
            torn_publish += 1
        if kills % 25 == 0:
            for sid, expect in acked.items():
                _verify(fresh, P1, sid, expect)
        if staging_leftovers(root):
            leftovers_seen += 1
        if kills % 3 == 0:
            fresh.reconcile()  # the next real mutation cleans every leftover
            _no_leftovers(root)
        if len(acked) > 300:
            doomed = sorted(acked)[:200]
            for i in range(0, len(doomed), 100):
                chunk = doomed[i : i + 100]
                assert fresh.prune(P1, ids=chunk, dry_run=False).removed == len(chunk)
            for sid in doomed:
                del acked[sid]
    zygote.close()
    final = StateStore(root)
    final.reconcile(full=True)
    _no_leftovers(root)
    assert set(_all_ids(final, P1)) == set(acked)
    for sid, expect in acked.items():
        _verify(final, P1, sid, expect)
    elapsed = time.monotonic() - started
    print(f"\ncrash test: {kills} SIGKILLs, {len(acked)} live states, {leftovers_seen} rounds left staging")
    print(f"crash test: {torn_publish} published-but-unacknowledged commits verified, {elapsed:.1f}s")
    assert leftovers_seen > 0  # the kills really landed inside commits


def test_two_processes_commit_concurrently_lose_nothing(tmp_path: Path) -> None:
    root = tmp_path / "home" / "runtime-state" / "v1"
    writers = [_spawn(root, P1, 1, "count:25"), _spawn(root, P1, 2, "count:25"), _spawn(root, P2, 3, "count:15")]
    janitor = _spawn(root, P1, 4, "reconcile:3")  # reconciling concurrently must not touch live staging
    for proc in [*writers, janitor]:
        _go(proc)
    acked: dict[str, dict[str, tuple[int, int]]] = {P1: {}, P2: {}}
    for proc, principal in zip(writers, (P1, P1, P2), strict=True):
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode()[-2000:]
        acked[principal].update(_acks(out))
    _out, err = janitor.communicate(timeout=120)
    assert janitor.returncode == 0, err.decode()[-2000:]
    assert len(acked[P1]) == 50 and len(acked[P2]) == 15
    store = StateStore(root)
    for principal in (P1, P2):
        assert set(_all_ids(store, principal)) == set(acked[principal])
        for sid, expect in acked[principal].items():
            _verify(store, principal, sid, expect)
    store.reconcile(full=True)
    _no_leftovers(root)


def test_live_commit_in_another_process_is_not_reaped_and_does_not_block(tmp_path: Path) -> None:
    """The catalog lock is not held while a payload streams; its staging entry stays live."""
    root = tmp_path / "home" / "runtime-state" / "v1"
    store = StateStore(root)
    other = commit_one(store)
    slow = _go(_spawn(root, P1, 77, "slow"))
    assert slow.stdout is not None and slow.stdin is not None
    assert slow.stdout.readline() == b"streaming\n"  # mid-stream, staging entry exists
    assert len(staging_leftovers(root)) == 1
    staging = [e for e in store.inventory() if e.kind == "staging"]
    assert len(staging) == 1 and staging[0].active
    t0 = time.monotonic()
    report = store.reconcile(full=True)  # neither blocks on nor removes the live staging entry
    assert report.staging_removed == 0 and len(staging_leftovers(root)) == 1
    assert store.purge(all=True).removed == 1  # 'other'; the live commit is untouched
    third = commit_one(store)
    assert time.monotonic() - t0 < 10
    slow.stdin.write(b"go on\n")
    slow.stdin.flush()
    out, err = slow.communicate(timeout=60)
    assert slow.returncode == 0, err.decode()[-2000:]
    acks = _acks(out)
    assert len(acks) == 1
    ((sid, expect),) = acks.items()
    _verify(StateStore(root), P1, sid, expect)
    assert set(_all_ids(store, P1)) == {sid, third.id} and other.id not in _all_ids(store, P1)
    assert staging_leftovers(root) == []


def commit_one(store: StateStore) -> StateRecord:
    return store.commit(P1, model_id="m", backend="b", envelope={}, payload=iter([b"x" * 10]))

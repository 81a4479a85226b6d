"""SIGKILL rounds against real store writer processes, shared by the store crash test and
``bench/crash_run.py``.

A writer is ``_crash_child.py`` (next to this file): it commits deterministic payloads in a
loop and prints one ``ack <id> <seed> <size>`` line after every commit returns, so every
complete line is an acknowledged commit. :func:`run_store_kills` kills writers at random
moments and, after every kill, checks the catalog through a fresh :class:`StateStore` (no
caches from before the kill). It counts failures instead of asserting, so a caller can
report them; the contract is that ``lost``, ``corrupt`` and ``unclean`` stay 0.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from werk_host.errors import WerkError
from werk_host.store import StateStore

from .helpers import payload_for, staging_leftovers

CHILD = Path(__file__).with_name("_crash_child.py")
#: Every this many rounds the victim is a whole fresh interpreter instead of a forked child.
FRESH_EVERY = 10


def spawn(root: Path, principal: str, seed: int, mode: str) -> subprocess.Popen[bytes]:
    """Start a writer; it imports everything, then waits for :func:`go`."""
    return subprocess.Popen(
        [sys.executable, str(CHILD), str(root), principal, str(seed), mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=CHILD.parent,
    )


def go(proc: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
    """Wait for the writer's ``ready`` and let it start."""
    assert proc.stdout is not None and proc.stdin is not None
    line = proc.stdout.readline()
    if line != b"ready\n":
        raise RuntimeError(f"writer did not start: {line!r}")
    proc.stdin.write(b"go\n")
    proc.stdin.flush()
    return proc


def parse_acks(raw: bytes) -> dict[str, tuple[int, int]]:
    """``{state id: (seed, size)}``; only complete lines count (a torn last line was never acked)."""
    out: dict[str, tuple[int, int]] = {}
    for line in raw.split(b"\n")[:-1]:
        tag, sid, seed, size = line.decode().split()
        if tag != "ack":
            raise RuntimeError(f"unexpected writer output {line!r}")
        out[sid] = (int(seed), int(size))
    return out


def all_ids(store: StateStore, principal: str) -> list[str]:
    """Every visible state id of ``principal``, through the paged listing."""
    ids: list[str] = []
    after = None
    while True:
        page, after = store.list_states(principal, limit=100, after=after)
        ids += [r.id for r in page]
        if after is None:
            return ids


def intact(store: StateStore, principal: str, sid: str, expect: tuple[int, int] | None = None) -> bool:
    """Whether ``sid`` is visible and its payload verifies and holds the writer's bytes.

    ``expect`` is the acknowledged (seed, size); without it the record's own metadata says.
    """
    rec = store.get(principal, sid)
    if rec is None:
        return False
    seed, size = expect if expect is not None else (rec.adapter_meta["seed"], rec.adapter_meta["size"])
    try:
        with store.open_payload(principal, sid) as f:
            data = f.read()
    except WerkError:
        return False
    return rec.bytes == size and data == payload_for(seed, size)


def unclean_entries(root: Path, principal: str) -> set[str]:
    """What a reconciliation must have removed: staging entries, interrupted temp files,
    and anything quarantined (nothing partial may ever have been published)."""
    found = set(staging_leftovers(root))
    pdir = root / f"p_{principal}"
    if pdir.is_dir():
        for sdir in pdir.iterdir():
            found |= {f"{sdir.name}/{n}" for n in os.listdir(sdir) if n.startswith(".tmp-")}
    quarantine = root / ".quarantine"
    if quarantine.is_dir():
        found |= {f".quarantine/{n}" for n in os.listdir(quarantine)}
    return found


class Zygote:
    """A pre-imported parent that forks one committing writer per round (no interpreter start-up)."""

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
        if not line:
            raise RuntimeError("the writer zygote died")
        return line.split()

    def kill_after(self, seed: int, delay: float) -> bytes:
        """Fork a committing writer, SIGKILL it after ``delay`` seconds, return its ack lines."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"fork {seed}\n".encode())
        self.proc.stdin.flush()
        tag, pid = self._line()
        if tag != "pid":
            raise RuntimeError(f"unexpected zygote output {tag!r}")
        time.sleep(delay)
        with contextlib.suppress(ProcessLookupError):  # already dead: its status below says why
            os.kill(int(pid), signal.SIGKILL)
        tag, dead, status = self._line()
        code = int(status)
        if (tag, dead) != ("exit", pid) or not (os.WIFSIGNALED(code) and os.WTERMSIG(code) == signal.SIGKILL):
            raise RuntimeError(f"writer {pid} failed before the kill (wait status {code})")
        path = self.ackdir / f"{seed}.acks"
        return path.read_bytes() if path.exists() else b""

    def close(self) -> None:
        _out, err = self.proc.communicate(input=b"", timeout=30)
        if self.proc.returncode != 0:
            raise RuntimeError(f"the writer zygote failed: {err.decode()[-2000:]}")


@dataclass
class StoreCrashStats:
    """Figures of :func:`run_store_kills`. ``lost``, ``corrupt`` and ``unclean`` must stay empty."""

    kills: int = 0
    #: Kills that landed inside a commit: a new staging entry was left, or a state was
    #: published whose acknowledgement never got out.
    mid_commit: int = 0
    #: Acknowledged commits observed in total.
    acked: int = 0
    #: Published but unacknowledged commits (verified like acknowledged ones, then tracked).
    torn_publish: int = 0
    live: int = 0
    #: Acknowledged commits not listed, or listed but not intact.
    lost: set[str] = field(default_factory=set)
    #: Listed states that fail verification (acknowledged or not).
    corrupt: set[str] = field(default_factory=set)
    #: What a reconciliation left behind or had to quarantine.
    unclean: set[str] = field(default_factory=set)
    seconds: float = 0.0


def run_store_kills(
    root: Path, principal: str, kills: int, rng: random.Random, ackdir: Path, *, seed_base: int = 0
) -> StoreCrashStats:
    """SIGKILL ``kills`` writers committing to ``root`` mid-work and audit after each kill.

    After every kill: every acknowledged state must be listed with its exact bytes, and a
    listed but unacknowledged state must verify. Every third round a reconciliation runs
    and must leave nothing unclean. Old states are pruned to keep the catalog bounded. A
    final full reconciliation and audit of everything end the run.
    """
    stats = StoreCrashStats()
    acked: dict[str, tuple[int, int]] = {}
    started = time.monotonic()
    zygote = Zygote(root, principal, ackdir)
    try:
        while stats.kills < kills:
            seed = seed_base + stats.kills + 1
            delay = rng.uniform(0.005, 0.060)
            staging_before = set(staging_leftovers(root))
            if stats.kills % FRESH_EVERY == FRESH_EVERY - 1:
                proc = go(spawn(root, principal, seed, "loop"))
                time.sleep(delay)
                proc.send_signal(signal.SIGKILL)
                out, err = proc.communicate()
                if proc.returncode != -signal.SIGKILL:
                    raise RuntimeError(f"writer failed before the kill: {err.decode()[-2000:]}")
            else:
                out = zygote.kill_after(seed, delay)
            stats.kills += 1
            new = parse_acks(out)
            stats.acked += len(new)
            acked.update(new)

            fresh = StateStore(root)
            visible = set(all_ids(fresh, principal))
            stats.lost |= set(acked) - visible
            torn = visible - set(acked)
            if set(staging_leftovers(root)) - staging_before or torn:
                stats.mid_commit += 1
            damaged = {s for s, e in new.items() if s in visible and not intact(fresh, principal, s, e)}
            for sid in torn:
                rec = fresh.get(principal, sid)
                if rec is None or not intact(fresh, principal, sid):
                    stats.corrupt.add(sid)
                    continue
                acked[sid] = (rec.adapter_meta["seed"], rec.adapter_meta["size"])
                stats.torn_publish += 1
            if stats.kills % 25 == 0:
                damaged |= {s for s, e in acked.items() if s in visible and not intact(fresh, principal, s, e)}
            stats.corrupt |= damaged
            stats.lost |= damaged  # acknowledged, but not intact
            if stats.kills % 3 == 0:
                fresh.reconcile()  # the next real mutation cleans every leftover
                stats.unclean |= unclean_entries(root, principal)
            if len(acked) > 300:
                doomed = sorted((set(acked) & visible) - stats.corrupt)[:200]
                for i in range(0, len(doomed), 100):
                    fresh.prune(principal, ids=doomed[i : i + 100], dry_run=False)
                for sid in doomed:
                    del acked[sid]
    finally:
        try:
            zygote.close()
        finally:
            if zygote.proc.poll() is None:
                zygote.proc.kill()
                zygote.proc.wait()
    final = StateStore(root)
    final.reconcile(full=True)
    stats.unclean |= unclean_entries(root, principal)
    visible = set(all_ids(final, principal))
    stats.lost |= set(acked) - visible
    damaged = {s for s, e in acked.items() if s in visible and not intact(final, principal, s, e)}
    stats.corrupt |= damaged
    stats.lost |= damaged
    stats.corrupt |= {s for s in visible - set(acked) if not intact(final, principal, s)}
    stats.live = len(visible)
    stats.seconds = time.monotonic() - started
    return stats

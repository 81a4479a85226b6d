"""werk_host.backends.child: children die with their parent; stale children are recognised and stopped."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil  # type: ignore[import-untyped]
import pytest

from werk_host.backend_caches import hold_owner_lock, try_owner_lock
from werk_host.backends.child import (
    _SPAWNER,
    SPAWNS,
    Guard,
    ManagedChild,
    _arm_death_signal,
    available_guard,
    create_run_dir,
    spawn,
)
from werk_host.backends.records import (
    RECORD_NAME,
    ChildRecord,
    StaleRunDir,
    read_record,
    reap_stale_run_dirs,
    stop_recorded,
    write_record,
)
from werk_host.testing.processes import gone

linux_only = pytest.mark.skipif(available_guard() != "pdeathsig", reason="PR_SET_PDEATHSIG is Linux-only")
GUARDS = [pytest.param("pdeathsig", marks=linux_only), "watchdog"]


def program(pid: int, timeout: float = 5.0) -> psutil.Process:
    """The ``sleep`` a spawned process runs: the process itself, or the watchdog wrapper's child
    once that has exec'd it (until then the child is a fork of the wrapper, its command line
    the wrapper's)."""
    deadline = time.monotonic() + timeout
    while True:
        proc = psutil.Process(pid)
        if proc.cmdline()[:1] == ["sleep"]:
            return proc
        for kid in proc.children():
            with contextlib.suppress(psutil.Error):
                if kid.cmdline()[:1] == ["sleep"]:
                    return kid
        assert time.monotonic() < deadline, f"{pid} started no program"
        time.sleep(0.02)


def kill_quietly(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


@pytest.fixture
def orphan() -> Iterator[Callable[[], int]]:
    """Start ``sleep`` processes whose parent already exited, like a child that outlived its owner."""
    started: list[int] = []

    def make() -> int:
        out = subprocess.run(
            ["sh", "-c", "sleep 300 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True, check=True
        )
        pid = int(out.stdout)
        started.append(pid)
        assert ChildRecord.of(pid) is not None
        return pid

    yield make
    for pid in started:
        kill_quietly(pid)


@pytest.fixture
def children() -> Iterator[list[ManagedChild]]:
    """Children spawned by a test; killed, reaped and released afterwards."""
    spawned: list[ManagedChild] = []
    yield spawned
    for child in spawned:
        if child.popen.returncode is None:
            kill_quietly(child.pid)
        child.popen.wait()
        child.release()


# -- the spawn count (werk serve builds its HTTP layer after its first spawn) ----------------


def test_a_waiter_for_the_next_spawn_returns_when_a_child_is_spawned(children: list[ManagedChild]) -> None:
    seen, never = SPAWNS.count, threading.Event()
    returned = threading.Event()
    waiter = threading.Thread(target=lambda: (SPAWNS.wait_past(seen, never), returned.set()), daemon=True)
    waiter.start()
    assert not returned.wait(0.2), "returned before any spawn"
    children.append(spawn(["sleep", "30"]))
    assert returned.wait(10) and SPAWNS.count == seen + 1
    waiter.join(5)


def test_a_waiter_for_the_next_spawn_returns_when_told_to() -> None:
    seen, until = SPAWNS.count, threading.Event()
    waiter = threading.Thread(target=SPAWNS.wait_past, args=(seen, until), daemon=True)
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive(), "returned with no spawn and nothing set"
    until.set()
    waiter.join(5)
    assert not waiter.is_alive() and SPAWNS.count == seen


# -- dying with the parent ------------------------------------------------------------------


@linux_only
def test_child_outlives_the_short_lived_thread_that_spawned_it(children: list[ManagedChild]) -> None:
    # PR_SET_PDEATHSIG fires when the *thread* that forked exits: spawning must not fork here.
    thread = threading.Thread(target=lambda: children.append(spawn(["sleep", "60"])))
    thread.start()
    thread.join()
    (child,) = children
    assert child.guard == "pdeathsig"
    time.sleep(0.5)
    assert child.popen.poll() is None
    assert psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE


_PARENT = textwrap.dedent(
    """
    import sys, threading, time
    from werk_host.backends.child import spawn
    out = []
    worker = threading.Thread(target=lambda: out.append(spawn(["sleep", "60"], guard=sys.argv[1])))
    worker.start()
    worker.join()  # the spawning thread is gone; the child must stay until the process dies
    print(out[0].pid, flush=True)
    time.sleep(120)
    """
)


@pytest.mark.parametrize("guard", GUARDS)
def test_child_dies_when_its_parent_is_sigkilled(guard: Guard) -> None:
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, guard], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        pid = int(parent.stdout.readline())
        family = [pid, program(pid).pid]
        time.sleep(0.3)
        assert not gone(family[-1], timeout=0)  # the program runs
        parent.kill()
        parent.wait()
        assert all(gone(p) for p in family), f"{guard}: child survived its SIGKILLed parent"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


@linux_only
def test_armed_child_exits_when_its_parent_is_already_gone() -> None:
    # The parent may die between fork and prctl(); the child then finds another parent and quits.
    popen = subprocess.Popen(["sleep", "60"], preexec_fn=_arm_death_signal(os.getpid() + 1_000_000))
    try:
        assert popen.wait(timeout=5) == 1
    finally:
        if popen.poll() is None:
            popen.kill()
            popen.wait()


@linux_only
def test_a_death_signal_that_cannot_be_armed_fails_the_spawn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("werk_host.backends.child._PRCTL", lambda *args: -1)  # prctl() refused
    with pytest.raises(OSError, match="cannot arm the parent-death signal for sleep"):
        spawn(["sleep", "60"])


def test_watchdog_wrapper_forwards_sigterm_and_exits_like_the_program(children: list[ManagedChild]) -> None:
    child = spawn(["sleep", "60"], guard="watchdog")
    children.append(child)
    sleeper = program(child.pid)
    assert sleeper.pid != child.pid and sleeper.cmdline() == ["sleep", "60"]
    assert os.getpgid(sleeper.pid) == child.pid  # one process group, led by the spawned process
    child.popen.terminate()  # the wrapper only
    assert child.popen.wait(timeout=5) == -signal.SIGTERM
    assert gone(sleeper.pid)
    status = spawn(["sh", "-c", "exit 3"], guard="watchdog")
    children.append(status)
    assert status.popen.wait(timeout=5) == 3


def test_releasing_the_watchdog_pipe_kills_the_program(children: list[ManagedChild]) -> None:
    child = spawn(["sleep", "60"], guard="watchdog")
    children.append(child)
    sleeper = program(child.pid)
    time.sleep(0.2)
    assert child.popen.poll() is None
    child.release()  # what the kernel does to the write end when this process dies
    assert child.popen.wait(timeout=5) == -signal.SIGKILL
    assert gone(sleeper.pid)


def test_spawn_refuses_an_unavailable_guard(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("werk_host.backends.child._PRCTL", None)
    assert available_guard() == "watchdog"
    with pytest.raises(ValueError, match="PDEATHSIG"):
        spawn(["true"], guard="pdeathsig")


# -- records --------------------------------------------------------------------------------


@pytest.mark.parametrize("guard", GUARDS)
def test_spawn_records_the_child_it_started(tmp_path: Path, children: list[ManagedChild], guard: Guard) -> None:
    child = spawn(["sleep", "60"], record_dir=tmp_path, guard=guard)
    children.append(child)
    record = read_record(tmp_path)
    assert record is not None and record == child.record
    assert record.pid == child.pid and record.cmdline[-2:] == ("sleep", "60")
    assert stat.S_IMODE((tmp_path / RECORD_NAME).stat().st_mode) == 0o600
    now = ChildRecord.of(child.pid)
    assert now is not None and record.same_process(now)
    assert not record.same_process(dataclasses.replace(now, create_time=now.create_time + 100))
    assert not record.same_process(dataclasses.replace(now, cmdline=(*now.cmdline[:-1], "61")))
    assert not record.same_process(dataclasses.replace(now, exe="/bin/other"))


def test_malformed_or_linked_records_are_ignored(tmp_path: Path) -> None:
    assert read_record(tmp_path) is None
    (tmp_path / RECORD_NAME).write_text('{"pid": "1", "create_time": 0, "exe": "x", "cmdline": []}')
    assert read_record(tmp_path) is None
    (tmp_path / RECORD_NAME).write_text("not json")
    assert read_record(tmp_path) is None
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    write_record(elsewhere, ChildRecord(1, 1.0, "/x", ("x",)))
    (tmp_path / RECORD_NAME).unlink()
    (tmp_path / RECORD_NAME).symlink_to(elsewhere / RECORD_NAME)
    assert read_record(elsewhere) == ChildRecord(1, 1.0, "/x", ("x",))
    assert read_record(tmp_path) is None


def test_stop_recorded_spares_a_process_that_reused_the_pid(orphan: Callable[[], int]) -> None:
    pid = orphan()
    record = ChildRecord.of(pid)
    assert record is not None
    assert not stop_recorded(dataclasses.replace(record, create_time=record.create_time - 100), grace=1)
    assert not stop_recorded(dataclasses.replace(record, cmdline=("sleep", "301")), grace=1)
    assert not stop_recorded(dataclasses.replace(record, exe="/usr/bin/other"), grace=1)
    assert not gone(pid, timeout=0.3)
    assert stop_recorded(record, grace=1)
    assert gone(pid, timeout=0)
    assert not stop_recorded(record, grace=1)  # nothing left to stop


def test_create_run_dir_is_locked_before_it_is_visible(tmp_path: Path) -> None:
    run_dir, fd = create_run_dir(tmp_path, "gen-abc")
    try:
        assert run_dir == tmp_path / "gen-abc" and stat.S_IMODE(run_dir.stat().st_mode) == 0o700
        assert try_owner_lock(run_dir) is None  # held (by this process, through ``fd``)
        assert [p.name for p in tmp_path.iterdir()] == ["gen-abc"]  # no staging directory left
    finally:
        os.close(fd)
    released = try_owner_lock(run_dir)
    assert released is not None
    os.close(released)


def test_reap_stale_run_dirs(tmp_path: Path, orphan: Callable[[], int], caplog: pytest.LogCaptureFixture) -> None:
    def record(pid: int) -> ChildRecord:
        found = ChildRecord.of(pid)
        assert found is not None
        return found

    def run_dir(name: str, record: ChildRecord | None) -> Path:
        path = tmp_path / name
        path.mkdir()
        os.close(hold_owner_lock(path))  # an owner that has gone: its lock was released
        if record is not None:
            write_record(path, record)
        return path

    stale, reused, live = orphan(), orphan(), orphan()
    run_dir("gen-stale", record(stale))
    run_dir("gen-reused", dataclasses.replace(record(reused), create_time=0.0))
    run_dir("gen-empty", None)
    held = run_dir("gen-held", record(live))
    lock = hold_owner_lock(held)  # its owner is alive
    other = run_dir("cache-other", record(live))
    (tmp_path / "gen-link").symlink_to(other)
    try:
        with caplog.at_level(logging.INFO, logger="werk_host.backends.records"):
            removed = reap_stale_run_dirs(tmp_path, prefix="gen-", grace=2)
    finally:
        os.close(lock)
    assert sorted(removed, key=lambda r: r.name) == [
        StaleRunDir("gen-empty", None),
        StaleRunDir("gen-reused", None),
        StaleRunDir("gen-stale", stale),
    ]
    assert gone(stale, timeout=0)
    assert not gone(reused, timeout=0.3) and not gone(live, timeout=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache-other", "gen-held", "gen-link"]
    assert len(caplog.records) == 3
    assert any(f"pid {stale}" in r.getMessage() for r in caplog.records)


def test_a_spawn_whose_caller_stopped_waiting_is_killed_and_reaped() -> None:
    """A caller interrupted while the spawner thread still runs its ``Popen`` owns nothing: the
    child that ``Popen`` then starts is killed and reaped there, and the spawner serves on."""
    entered, proceed = threading.Event(), threading.Event()
    spawned: list[subprocess.Popen[bytes]] = []

    def start() -> subprocess.Popen[bytes]:
        entered.set()
        proceed.wait(10)
        spawned.append(subprocess.Popen(["sleep", "60"], start_new_session=True))
        return spawned[0]

    main = threading.main_thread().ident
    assert main is not None
    interrupt = threading.Thread(target=lambda: (entered.wait(10), signal.pthread_kill(main, signal.SIGINT)))
    interrupt.start()
    with pytest.raises(KeyboardInterrupt):
        _SPAWNER.run(start)
    interrupt.join()
    proceed.set()
    deadline = time.monotonic() + 10
    while (not spawned or spawned[0].returncode is None) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert spawned and spawned[0].returncode == -signal.SIGKILL
    again = _SPAWNER.run(lambda: subprocess.Popen(["true"]))
    assert again.wait(10) == 0


def test_a_spawn_that_raises_raises_in_its_caller() -> None:
    def start() -> subprocess.Popen[bytes]:
        raise OSError(2, "no such program")

    with pytest.raises(OSError, match="no such program"):
        _SPAWNER.run(start)

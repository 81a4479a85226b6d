"""Child records and stale run directories: recognising a backend child again, and only it.

:func:`werk_host.backends.child.spawn` with ``record_dir`` writes a :class:`ChildRecord` (pid,
creation time, executable, command line) to ``record_dir/child.json`` once the child runs; the
record describes the child of the directory it lies in. Such run directories are made with
:func:`werk_host.backends.child.create_run_dir`, which holds their owner lock
(:mod:`werk_host.backend_caches`) before they become visible under their name.

:func:`reap_stale_run_dirs`, run by a later owner over the parent of such directories, treats
each one whose owner lock no live process holds as a leftover: its recorded child is stopped if,
and only if, the live process with that pid still has the recorded creation time, executable and
command line (a process that merely reused the pid is never signalled), and the directory is
removed. Like ``ps``, the record shows the whole command line: pass secrets to a child through
``env``, never ``argv``.

This module is imported after a start's first spawn, never before it: psutil and dataclasses
cost ~12 ms of the way to it (docs/operations.md, "Start-up").
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import stat
import time
from dataclasses import dataclass
from pathlib import Path

import psutil  # type: ignore[import-untyped]

from werk_host.backend_caches import remove_tree, try_owner_lock

__all__ = [
    "CREATE_TIME_TOLERANCE_S",
    "RECORD_NAME",
    "ChildRecord",
    "ChildStopError",
    "StaleRunDir",
    "read_record",
    "reap_stale_run_dirs",
    "stop_recorded",
    "write_record",
]

log = logging.getLogger(__name__)

RECORD_NAME = "child.json"
MAX_RECORD_BYTES = 1 << 20
CREATE_TIME_TOLERANCE_S = 1.0
"""psutil derives creation times from the boot time, which another process may compute up to a second off."""
KILL_WAIT_S = 5.0


class ChildStopError(OSError):
    """A recorded child was recognised but could not be stopped (not permitted, or it outlived SIGKILL)."""


# -- records --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChildRecord:
    """Who a started child is: enough to find it again and never to mistake another process for it."""

    pid: int
    create_time: float
    exe: str
    cmdline: tuple[str, ...]

    @classmethod
    def of(cls, pid: int) -> ChildRecord | None:
        """The live process ``pid`` as a record; ``None`` if it is gone, a zombie, or not inspectable."""
        try:
            return cls._from_process(psutil.Process(pid))
        except psutil.Error:
            return None

    @classmethod
    def _from_process(cls, proc: psutil.Process) -> ChildRecord:
        with proc.oneshot():
            return cls(
                pid=int(proc.pid),
                create_time=float(proc.create_time()),
                exe=str(proc.exe()),
                cmdline=tuple(str(arg) for arg in proc.cmdline()),
            )

    def same_process(self, other: ChildRecord) -> bool:
        """True when ``other`` (a fresh observation) is the process this record describes."""
        return (
            self.pid == other.pid
            and abs(self.create_time - other.create_time) <= CREATE_TIME_TOLERANCE_S
            and self.exe == other.exe
            and self.cmdline == other.cmdline
        )

    def to_json(self) -> dict[str, object]:
        return {"pid": self.pid, "create_time": self.create_time, "exe": self.exe, "cmdline": list(self.cmdline)}

    @classmethod
    def from_json(cls, data: object) -> ChildRecord | None:
        """The record in ``data``, or ``None`` when it is not a well-formed record."""
        if not isinstance(data, dict):
            return None
        pid, created, exe, cmdline = data.get("pid"), data.get("create_time"), data.get("exe"), data.get("cmdline")
        if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
            return None
        if not isinstance(created, int | float) or isinstance(created, bool) or not isinstance(exe, str):
            return None
        if not isinstance(cmdline, list) or not all(isinstance(arg, str) for arg in cmdline):
            return None
        return cls(pid, float(created), exe, tuple(cmdline))


def write_record(directory: Path, record: ChildRecord) -> Path:
    """Atomically write ``record`` as ``directory/child.json`` (mode 0600, no link followed); returns the path."""
    path = directory / RECORD_NAME
    tmp = directory / f".{RECORD_NAME}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(record.to_json(), out, separators=(",", ":"))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def read_record(directory: Path) -> ChildRecord | None:
    """The record in ``directory``, or ``None`` when it is missing, a link, oversized or malformed."""
    try:
        fd = os.open(directory / RECORD_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as source:
        raw = source.read(MAX_RECORD_BYTES + 1)
    if len(raw) > MAX_RECORD_BYTES:
        return None
    try:
        return ChildRecord.from_json(json.loads(raw))
    except ValueError:
        return None


# -- stale children -------------------------------------------------------------------------


def _gone(proc: psutil.Process) -> bool:
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _signal_all(procs: list[psutil.Process], sig: signal.Signals) -> None:
    for proc in procs:
        try:
            proc.send_signal(sig)  # psutil refuses a pid that was reused since ``proc`` was made
        except psutil.NoSuchProcess:
            pass
        except psutil.AccessDenied as err:
            raise ChildStopError(f"not permitted to signal recorded child {proc.pid}") from err


def _wait_gone(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Poll until every process is gone (zombies count as gone); the ones still alive at ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p in procs if not _gone(p)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.05)


def stop_recorded(record: ChildRecord, *, grace: float = 5.0) -> bool:
    """Stop the process ``record`` describes, with everything it started: SIGTERM, SIGKILL after ``grace`` s.

    Returns False, signalling nothing, when no live process is the recorded one (gone, or its
    pid now belongs to a process with another creation time, executable or command line);
    True once it was recognised and is gone. Raises :class:`ChildStopError` when it was
    recognised but could not be stopped.
    """
    try:
        proc = psutil.Process(record.pid)
        current = ChildRecord._from_process(proc)
    except psutil.Error:
        return False
    if not record.same_process(current):
        return False
    try:
        family = [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return True
    except psutil.AccessDenied:
        family = [proc]
    _signal_all(family, signal.SIGTERM)
    alive = _wait_gone(family, grace)
    if alive:
        _signal_all(alive, signal.SIGKILL)
        alive = _wait_gone(alive, KILL_WAIT_S)
    if alive:
        raise ChildStopError(f"recorded child {record.pid} outlived SIGKILL")
    return True


@dataclass(frozen=True)
class StaleRunDir:
    """One leftover run directory :func:`reap_stale_run_dirs` removed."""

    name: str
    stopped_pid: int | None
    """The recorded child it stopped, or ``None`` when that child was already gone."""


def reap_stale_run_dirs(work_dir: Path, *, prefix: str, grace: float = 5.0) -> list[StaleRunDir]:
    """Stop the children of, and remove, every ``work_dir/<prefix>*`` directory no live owner holds.

    A directory is a leftover when its owner lock can be taken (its owner is gone; a holder in
    this process counts as live). Its recorded child is stopped with :func:`stop_recorded`
    (never a process that merely reused the pid); then the directory is removed while the lock
    is held. A directory whose child could not be stopped is kept (and a warning logged). Links
    and plain files are skipped. One line is logged per removed directory.
    """
    removed: list[StaleRunDir] = []
    try:
        names = sorted(os.listdir(work_dir))
    except FileNotFoundError:
        return removed
    for name in names:
        entry = work_dir / name
        try:
            if not name.startswith(prefix) or not stat.S_ISDIR(os.lstat(entry).st_mode):
                continue
            fd = try_owner_lock(entry)
        except FileNotFoundError:
            continue  # removed meanwhile
        if fd is None:
            continue  # a live owner holds it
        try:
            record = read_record(entry)
            try:
                stopped = record is not None and stop_recorded(record, grace=grace)
            except ChildStopError as err:
                log.warning("kept stale run directory %s: %s", name[:16], err)
                continue
            try:
                remove_tree(entry)
            except OSError as err:
                log.warning("cannot remove stale run directory %s: %s", name[:16], err.strerror)
                continue
        finally:
            os.close(fd)
        pid = record.pid if stopped and record is not None else None
        if pid is not None:
            log.warning("stopped orphaned child pid %d and removed its run directory %s", pid, name[:16])
        else:
            log.info("removed stale run directory %s", name[:16])
        removed.append(StaleRunDir(name, pid))
    return removed

"""Managed child processes: children that die with their parent, and cleanup of stale ones.

Backends that run a native server (llama.cpp's ``llama-server``; later vLLM, MLX) start it with
:func:`spawn`. The contract:

* **The child dies with the process that spawned it**, whatever ends that process (a clean
  exit, a crash, SIGKILL). Three guards exist; :func:`available_guard` names the one used by
  default.

  - ``"pdeathsig"`` (Linux): ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` is armed in the child between
    fork and exec. The kernel sends that signal when the *thread* that forked exits, not the
    process, so every fork of this module happens on one dedicated daemon thread that lives until
    the process exits; callers may spawn from short-lived threads (request workers). Once armed,
    the child checks that its parent is still the spawning process and exits at once otherwise,
    which closes the race with a parent that died before the signal was armed.
  - ``"watchdog"`` (everywhere else): the program runs under a small wrapper
    (:mod:`werk_host.backends._watchdog`) that holds the read end of a pipe whose write end only
    this process holds, and kills the program when it reads end of file. :attr:`ManagedChild.pid`
    is then the wrapper's pid; the wrapper forwards SIGTERM, SIGINT and SIGHUP and exits like the
    program. A program that cannot be executed shows up as the wrapper exiting with status 1 (a
    traceback on its ``stderr``), not as an :class:`OSError`. The guard holds only while no
    process forked from this one *without* exec keeps a copy of the write end.
  - ``"group"`` (everywhere, asked for explicitly): the same wrapper and pipe, but at end of
    file it SIGKILLs the child's whole process group, so everything the program started dies
    with this process too (an engine whose workers are its own children, e.g. ``vllm serve``).
    The wrapper does not forward stop signals: a stop signalled to the group (as
    :class:`~werk_host.backends.managed.ManagedProcess` stops) reaches the program directly.
    This is the one process-group guard backends use (``werk_host.plugin.process``).

* **The child leads a new session**, hence a process group whose id is :attr:`ManagedChild.pid`:
  a signal to that group reaches everything the child starts. Descriptors other than the three
  standard streams are not inherited.
* **A child can be recognised later.** With ``record_dir``, :func:`spawn` writes a
  :class:`ChildRecord` (pid, creation time, executable, command line) to
  ``record_dir/child.json``; the record describes the child of the directory it lies in.
  Such run directories are made with :func:`create_run_dir`, which holds their owner lock
  (:mod:`werk_host.backend_caches`) before they become visible under their name.
  :func:`reap_stale_run_dirs`, run by a later owner over the parent of such directories, treats
  each one whose owner lock no live process holds as a leftover:
  its recorded child is stopped if, and only if, the live process with that pid still has the
  recorded creation time, executable and command line (a process that merely reused the pid is
  never signalled), and the directory is removed. Like ``ps``, the record shows the whole
  command line: pass secrets to a child through ``env``, never ``argv``.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import queue
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal

import psutil  # type: ignore[import-untyped]

from werk_host.backend_caches import hold_owner_lock, try_owner_lock

__all__ = [
    "CREATE_TIME_TOLERANCE_S",
    "RECORD_NAME",
    "ChildRecord",
    "ChildStopError",
    "Guard",
    "ManagedChild",
    "StaleRunDir",
    "available_guard",
    "create_run_dir",
    "read_record",
    "reap_stale_run_dirs",
    "spawn",
    "stop_recorded",
    "write_record",
]
#: Reads of a just-spawned child's command line, 2 ms apart, until it is not empty.
_EXEC_SETTLE_TRIES = 50

log = logging.getLogger(__name__)

Guard = Literal["pdeathsig", "watchdog", "group"]
StdStream = int | IO[bytes] | None
"""What :func:`spawn` accepts for a standard stream: a file object, an fd, ``subprocess.DEVNULL``/``STDOUT``."""

RECORD_NAME = "child.json"
MAX_RECORD_BYTES = 1 << 20
CREATE_TIME_TOLERANCE_S = 1.0
"""psutil derives creation times from the boot time, which another process may compute up to a second off."""
KILL_WAIT_S = 5.0
_PR_SET_PDEATHSIG = 1
_WATCHDOG = Path(__file__).with_name("_watchdog.py")


class ChildStopError(OSError):
    """A recorded child was recognised but could not be stopped (not permitted, or it outlived SIGKILL)."""


# -- the parent-death guard ------------------------------------------------------------------


def _load_prctl() -> Callable[[int, int, int, int, int], int] | None:
    """libc's ``prctl`` on Linux, resolved once in the parent (the forked child must not load libraries)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


_PRCTL = _load_prctl()


def available_guard() -> Guard:
    """The guard :func:`spawn` uses by default here: ``"pdeathsig"`` on Linux, else ``"watchdog"``."""
    return "pdeathsig" if _PRCTL is not None else "watchdog"


def _arm_death_signal(parent: int) -> Callable[[], None]:
    """The ``preexec_fn`` for a child of process ``parent``: SIGKILL on parent death, or exit now if it is gone."""
    prctl = _PRCTL
    if prctl is None:
        raise ValueError("PR_SET_PDEATHSIG is not available on this platform")
    sigkill = int(signal.SIGKILL)

    def arm() -> None:  # runs in the forked child: no imports, nothing that takes locks
        if prctl(_PR_SET_PDEATHSIG, sigkill, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent:
            os._exit(1)  # the parent died before the signal was armed: nothing would ever kill us

    return arm


def _kill_now(popen: subprocess.Popen[bytes]) -> None:
    """SIGKILL an unreaped child's process group and reap it."""
    if popen.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(popen.pid, signal.SIGKILL)
    popen.wait()


def _kill_unclaimed(future: Future[subprocess.Popen[bytes]]) -> None:
    """Done-callback for a spawn whose caller stopped waiting (e.g. KeyboardInterrupt): nobody owns the child."""
    if not future.cancelled() and future.exception() is None:
        _kill_now(future.result())


_Job = tuple[Callable[[], subprocess.Popen[bytes]], Future[subprocess.Popen[bytes]]]


class _Spawner:
    """Runs every ``Popen`` of this module on one daemon thread that lives as long as the process.

    The kernel's parent-death signal follows the thread that forked, so that thread must outlive
    every child. A daemon thread blocked on its queue ends only with the process. After an
    ``os.fork`` the thread is gone in the child process; a new one is started there on demand.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._owner_pid = -1

    def run(self, start: Callable[[], subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
        """``start()`` executed on the spawner thread; its result or exception is the caller's."""
        future: Future[subprocess.Popen[bytes]] = Future()
        with self._lock:
            if self._owner_pid != os.getpid():
                self._jobs = queue.SimpleQueue()
                thread = threading.Thread(
                    target=self._serve, args=(self._jobs,), name="werk-child-spawner", daemon=True
                )
                thread.start()
                self._owner_pid = os.getpid()
            self._jobs.put((start, future))
        try:
            return future.result()
        except BaseException:
            future.add_done_callback(_kill_unclaimed)
            raise

    @staticmethod
    def _serve(jobs: queue.SimpleQueue[_Job]) -> None:
        while True:
            start, future = jobs.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(start())
            except BaseException as exc:  # delivered to the waiting caller; this thread must live on
                future.set_exception(exc)


_SPAWNER = _Spawner()


class SpawnCount:
    """How many children :func:`spawn` has started in this process (:data:`SPAWNS`).

    ``werk serve`` imports and builds its HTTP layer once the first backend child of its start
    is spawned, not alongside the work before the spawn: both need the interpreter, and the
    spawn is what the first answer waits for (docs/operations.md, "Start-up")."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._count = 0

    @property
    def count(self) -> int:
        with self._cond:
            return self._count

    def add(self) -> None:
        with self._cond:
            self._count += 1
            self._cond.notify_all()

    def wait_past(self, seen: int, until: threading.Event, poll_s: float = 0.01) -> None:
        """Return once a child was spawned after :attr:`count` read ``seen``, or ``until`` is set."""
        with self._cond:
            while self._count <= seen and not until.is_set():
                self._cond.wait(poll_s)


#: This process's children (:class:`SpawnCount`).
SPAWNS = SpawnCount()


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


# -- spawning -------------------------------------------------------------------------------


class ManagedChild:
    """A child started by :func:`spawn`.

    The caller stops and reaps :attr:`popen` (signalling the group :attr:`pid` while it is not
    yet reaped), then calls :meth:`release`.
    """

    def __init__(
        self, popen: subprocess.Popen[bytes], guard: Guard, record: ChildRecord | None, watchdog_fd: int | None
    ) -> None:
        self.popen = popen
        self.guard: Guard = guard
        self.record = record
        """What was written to ``record_dir`` (``None`` without one, or when the child had already exited)."""
        self._watchdog_fd = watchdog_fd

    @property
    def pid(self) -> int:
        """The spawned process (the watchdog wrapper on that path), leader of the child's process group."""
        return self.popen.pid

    def release(self) -> None:
        """Free the guard's resources (the watchdog pipe). Idempotent.

        Call it once the child was reaped: on the watchdog path, releasing earlier kills the child.
        """
        fd, self._watchdog_fd = self._watchdog_fd, None
        if fd is not None:
            os.close(fd)

    def __repr__(self) -> str:
        return f"<ManagedChild pid={self.pid} guard={self.guard}>"


def spawn(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    stdin: StdStream = subprocess.DEVNULL,
    stdout: StdStream = None,
    stderr: StdStream = None,
    record_dir: Path | None = None,
    guard: Guard | None = None,
) -> ManagedChild:
    """Start ``argv`` as a child that dies with this process (see the module docstring).

    ``env`` replaces the environment (``None``: inherit). ``guard`` defaults to
    :func:`available_guard`; ``"pdeathsig"`` where it is unavailable raises :class:`ValueError`.
    Returns once the program (``pdeathsig``) or the wrapper (``watchdog``, ``group``) was executed; raises
    :class:`OSError` when it could not be. With ``record_dir``, a failure to write the record
    kills the child and raises.
    """
    chosen = guard or available_guard()
    program = [str(arg) for arg in argv]

    def spawn(
        args: list[str], *, preexec_fn: Callable[[], None] | None = None, pass_fds: tuple[int, ...] = ()
    ) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            args,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            env=env,
            cwd=cwd,
            start_new_session=True,
            close_fds=True,
            preexec_fn=preexec_fn,
            pass_fds=pass_fds,
        )

    if chosen == "pdeathsig":
        arm = _arm_death_signal(os.getpid())
        try:
            popen = _SPAWNER.run(lambda: spawn(program, preexec_fn=arm))
        except subprocess.SubprocessError as err:  # raised by ``arm`` in the child; nothing was executed
            raise OSError(f"cannot arm the parent-death signal for {program[0]}") from err
        child = ManagedChild(popen, chosen, None, None)
    else:
        read_fd, write_fd = os.pipe()  # both non-inheritable; the wrapper gets the read end alone
        group = ["--group"] if chosen == "group" else []
        wrapped = [sys.executable, "-I", "-S", str(_WATCHDOG), *group, str(read_fd), *program]
        try:
            popen = _SPAWNER.run(lambda: spawn(wrapped, pass_fds=(read_fd,)))
        except BaseException:
            os.close(write_fd)
            raise
        finally:
            os.close(read_fd)
        child = ManagedChild(popen, chosen, None, write_fd)
    SPAWNS.add()
    if record_dir is not None:
        try:
            child.record = ChildRecord.of(popen.pid)
            for _ in range(_EXEC_SETTLE_TRIES):  # /proc/<pid>/cmdline reads empty while exec completes
                if child.record is None or child.record.cmdline:
                    break
                time.sleep(0.002)
                child.record = ChildRecord.of(popen.pid)
            if child.record is not None:
                write_record(record_dir, child.record)
        except BaseException:
            _kill_now(popen)
            child.release()
            raise
    return child


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
                shutil.rmtree(entry)
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


def create_run_dir(work_dir: Path, name: str) -> tuple[Path, int]:
    """Create the private (0700) directory ``work_dir/name`` already holding its owner lock.

    Returns the directory and the fd holding the lock (close it to release). The directory is
    made and locked under a hidden temporary name and then renamed, so it never exists under
    ``name`` unlocked: a concurrent :func:`reap_stale_run_dirs` cannot take it for a leftover.
    ``name`` must be fresh (a random generation id).
    """
    staging = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=work_dir))
    try:
        fd = hold_owner_lock(staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    target = work_dir / name
    try:
        os.rename(staging, target)
    except BaseException:
        os.close(fd)
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target, fd

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
  :class:`~werk_host.backends.records.ChildRecord` to ``record_dir/child.json`` once the child
  runs; such run directories are made with :func:`create_run_dir`, which holds their owner lock
  before they become visible under their name, and a later owner reaps the leftovers
  (:mod:`werk_host.backends.records`). This module is imported before a start's first spawn
  (:mod:`werk_host.backends.launch`): it imports only the standard library it needs for that,
  and the records module once a child runs (docs/operations.md, "Start-up").
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Literal

from werk_host.backend_caches import hold_owner_lock, remove_tree

if TYPE_CHECKING:
    import logging

    from werk_host.backends.records import ChildRecord

__all__ = [
    "Guard",
    "ManagedChild",
    "available_guard",
    "create_run_dir",
    "logger",
    "spawn",
]
#: Reads of a just-spawned child's command line, 2 ms apart, until it is not empty.
_EXEC_SETTLE_TRIES = 50


def logger(name: str) -> logging.Logger:
    """``logging.getLogger(name)`` for the modules imported before the first spawn, which do not
    import :mod:`logging` until they log (docs/operations.md, "Start-up")."""
    import logging

    return logging.getLogger(name)


Guard = Literal["pdeathsig", "watchdog", "group"]
StdStream = int | IO[bytes] | None
"""What :func:`spawn` accepts for a standard stream: a file object, an fd, ``subprocess.DEVNULL``/``STDOUT``."""

_PR_SET_PDEATHSIG = 1
_WATCHDOG = Path(__file__).with_name("_watchdog.py")


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


class _Job:
    """One ``Popen`` for the spawner thread and its outcome. A child whose caller stopped waiting
    (e.g. KeyboardInterrupt) is owned by nobody: it is killed and reaped."""

    def __init__(self, start: Callable[[], subprocess.Popen[bytes]]) -> None:
        self._start = start
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._popen: subprocess.Popen[bytes] | None = None
        self._error: BaseException | None = None
        self._abandoned = False

    def run(self) -> None:
        """On the spawner thread: ``start()``, its result or exception kept for :meth:`result`."""
        popen: subprocess.Popen[bytes] | None = None
        try:
            popen = self._start()
        except BaseException as exc:  # delivered to the waiting caller; the spawner must live on
            self._error = exc
        with self._lock:
            self._popen, abandoned = popen, self._abandoned
            self._done.set()
        if abandoned and popen is not None:
            _kill_now(popen)

    def result(self) -> subprocess.Popen[bytes]:
        """Wait for :meth:`run`; its child, or its exception raised here."""
        try:
            self._done.wait()
        except BaseException:
            with self._lock:
                self._abandoned, popen = True, self._popen
            if popen is not None:
                _kill_now(popen)
            raise
        if self._error is not None:
            raise self._error
        assert self._popen is not None
        return self._popen


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
        job = _Job(start)
        with self._lock:
            if self._owner_pid != os.getpid():
                self._jobs = queue.SimpleQueue()
                thread = threading.Thread(
                    target=self._serve, args=(self._jobs,), name="werk-child-spawner", daemon=True
                )
                thread.start()
                self._owner_pid = os.getpid()
            self._jobs.put(job)
        return job.result()

    @staticmethod
    def _serve(jobs: queue.SimpleQueue[_Job]) -> None:
        while True:
            jobs.get().run()


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
        from werk_host.backends.records import ChildRecord, write_record  # once the child runs

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


def create_run_dir(work_dir: Path, name: str) -> tuple[Path, int]:
    """Create the private (0700) directory ``work_dir/name`` already holding its owner lock.

    Returns the directory and the fd holding the lock (close it to release). The directory is
    made and locked under a hidden temporary name and then renamed, so it never exists under
    ``name`` unlocked: a concurrent :func:`reap_stale_run_dirs` cannot take it for a leftover.
    ``name`` must be fresh (a random generation id).
    """
    staging = work_dir / f".{name}.{os.urandom(8).hex()}"
    os.mkdir(staging, 0o700)  # as tempfile.mkdtemp does, without importing it before the first spawn
    try:
        fd = hold_owner_lock(staging)
    except BaseException:
        remove_tree(staging, ignore_errors=True)
        raise
    target = work_dir / name
    try:
        os.rename(staging, target)
    except BaseException:
        os.close(fd)
        remove_tree(staging, ignore_errors=True)
        raise
    return target, fd

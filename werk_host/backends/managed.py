"""A managed backend process: one native server child, its log, a readiness wait and a guaranteed stop.

Backend plugins that run a native server (llama.cpp's ``llama-server``; vLLM, oMLX) describe the
child (argv, environment, log file, run directory) and leave its life to :class:`ManagedProcess`.
The contract:

* **Start.** :meth:`ManagedProcess.start` runs ``argv`` with :func:`werk_host.backends.child.spawn`:
  the child dies with this process whatever ends it (SIGKILL included) and leads its own session,
  hence a process group whose id is :attr:`ManagedProcess.pid`. Its stdin is ``/dev/null``; its
  stdout and stderr are appended to ``log_path`` (created 0600, never through a symlink). This
  process keeps no descriptor of the log. A program that cannot be executed raises the startup
  error (below) with no log tail.
* **Log tail.** :meth:`ManagedProcess.log_tail` and :func:`read_log_tail` return at most
  ``lines`` lines of at most the last ``max_bytes`` bytes of the log (decoded leniently), with
  every string in ``secrets`` replaced by ``[redacted]``.
* **Readiness.** :meth:`ManagedProcess.wait_ready` polls a caller's ``ready()`` callable (for an
  HTTP server: :func:`http_ready`, ``GET`` a path until it answers 200) with a short backoff
  until it returns True. Between two polls the log's size is looked at every 2 ms: a child that
  wrote to it is asked at once and again 2, 4, 8 and 16 ms later, since servers log as they
  become ready (llama-server's last lines of a load are "model loaded" and "listening", its
  ``/health`` answers 200 a moment later: docs/operations.md, "Start-up"). When the child
  exits first, the timeout passes, or ``ready`` raises, the child is stopped and a
  :class:`BackendStartupError` (or the caller's ``error_type`` subclass) is raised carrying the
  redacted log tail, the exit status (``None`` when the child was still running at the
  timeout) and the argv. There is no retry.
* **Stop.** :meth:`ManagedProcess.stop` sends SIGTERM to the child's process group, SIGKILL
  after the grace period, SIGKILL again to any member of the group still alive once the leader
  exited, reaps the leader, then removes ``cleanup_dir`` (if given) and closes ``owner_fd`` (the
  run directory's owner lock, if given). The leader is never reaped before that:
  :meth:`~ManagedProcess.alive` and :attr:`~ManagedProcess.returncode` only peek
  (``waitid(WNOWAIT)``), so the group id cannot have been reused when it is signalled. ``stop``
  is idempotent and also releases ``cleanup_dir``/``owner_fd`` of a process never started.
* **No leftovers.** A started process is in a weak registry (:func:`live_children`) until it is
  stopped. One that is garbage collected, or still running at interpreter exit, is stopped by a
  ``weakref.finalize`` (2 s grace). :func:`install_signal_cleanup` makes SIGINT, SIGTERM and
  SIGHUP stop every registered child gracefully (:func:`stop_all`) before the previous handler
  runs (or the default action is re-delivered), and runs :func:`stop_all` at exit.
"""

from __future__ import annotations

import atexit
import contextlib
import http.client
import os
import shutil
import signal
import stat
import subprocess
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from werk_host.backends.child import Guard, ManagedChild, spawn
from werk_host.backends.launch import Reservation, free_port

__all__ = [
    "LOG_TAIL_LINES",
    "LOG_TAIL_MAX_BYTES",
    "REDACTED",
    "BackendProcessError",
    "BackendStartupError",
    "ManagedProcess",
    "find_executable",
    "free_port",
    "http_ready",
    "is_executable_file",
    "install_signal_cleanup",
    "live_children",
    "read_log_tail",
    "redact",
    "stop_all",
]


def is_executable_file(path: Path) -> bool:
    """Whether ``path`` is a regular file this process may execute."""
    try:
        st = path.stat()
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and os.access(path, os.X_OK)


def find_executable(
    name: str,
    *,
    explicit: str | os.PathLike[str] | None,
    env_var: str,
    error: Callable[[str], FileNotFoundError],
    env: Mapping[str, str] | None = None,
    use_path: bool = True,
) -> Path | None:
    """A backend's executable as an absolute path: ``explicit`` (a backend option), else
    ``$env_var``, else ``name`` on ``PATH``; ``None`` when none is configured or found there.
    A configured value that is not an executable file raises ``error(message)``, naming where
    it came from (the message may name paths: log it, never answer it)."""
    e = os.environ if env is None else env
    for value, source in ((explicit, "given by a backend option"), (e.get(env_var), f"{env_var}")):
        if value is None or str(value) == "":
            continue
        path = Path(value).expanduser()
        if not is_executable_file(path):
            raise error(f"{name} {source} is not an executable file: {path}")
        return path.absolute()
    found = shutil.which(name, path=e.get("PATH")) if use_path else None
    return Path(found).absolute() if found else None


LOG_TAIL_LINES = 40
LOG_TAIL_MAX_BYTES = 256 * 1024
REDACTED = "[redacted]"
KILL_WAIT_S = 30.0
FINALIZE_GRACE_S = 2.0
#: A loaded child is noticed within this share of the time it has been loading, at least
#: ``_POLL_MIN_S`` and at most ``_POLL_MAX_S`` (a readiness check is one loopback request):
#: docs/operations.md, "Start-up".
_POLL_SHARE = 0.05
_POLL_MIN_S = 0.005
_POLL_MAX_S = 0.05
#: Between polls the log's size is looked at every ``_LOG_WATCH_S``; once it grew, the child is
#: asked at once and after each of ``_LOG_PROBES_S`` more (module docstring).
_LOG_WATCH_S = 0.002
_LOG_PROBES_S = (0.002, 0.002, 0.004, 0.008)


class BackendProcessError(RuntimeError):
    """Base class of managed backend process errors."""


class BackendStartupError(BackendProcessError):
    """The child did not become ready. ``reason`` says why; ``log_tail`` (redacted) holds the end of its log;
    ``returncode`` is its exit status, ``None`` if it was still running (a timeout) or never ran."""

    def __init__(
        self, message: str, *, log_tail: str, returncode: int | None, argv: Sequence[str], name: str = "backend"
    ) -> None:
        full = f"{message}\n--- {name} log (tail) ---\n{log_tail}" if log_tail else message
        super().__init__(full)
        self.reason = message
        self.log_tail = log_tail
        self.returncode = returncode
        self.argv = list(argv)


# -- helpers ------------------------------------------------------------------------------------


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every non-empty string of ``secrets`` replaced by ``[redacted]``."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, REDACTED)
    return text


def read_log_tail(
    path: str | os.PathLike[str],
    lines: int = LOG_TAIL_LINES,
    *,
    max_bytes: int = LOG_TAIL_MAX_BYTES,
    secrets: Iterable[str] = (),
) -> str:
    """The last ``lines`` lines within the last ``max_bytes`` bytes of a log file, redacted; ``""`` if unreadable.

    The file is opened without following a symlink and read from ``max_bytes`` before its end, so
    a huge log costs no more than that.
    """
    if lines <= 0:
        return ""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return ""
    with os.fdopen(fd, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - max_bytes))
        data = f.read(max_bytes)
    text = data.decode("utf-8", errors="replace")
    return redact("\n".join(text.splitlines()[-lines:]), secrets)


def _size(path: Path) -> int:
    """The size of the file at ``path``; -1 when it cannot be read."""
    try:
        return os.stat(path).st_size
    except OSError:
        return -1


def http_ready(
    host: str, port: int, path: str = "/health", *, headers: Mapping[str, str] | None = None, timeout: float = 2.0
) -> Callable[[], bool]:
    """A ``ready`` callable for :meth:`ManagedProcess.wait_ready`: ``GET path`` answers 200.

    Any other status, a refused or dropped connection, or a timeout counts as not ready yet.
    """
    sent = dict(headers or {})

    def ready() -> bool:
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
        try:
            conn.request("GET", path, headers=sent)
            response = conn.getresponse()
            response.read()
            return response.status == 200
        except (OSError, http.client.HTTPException):
            return False
        finally:
            conn.close()

    return ready


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _peek(popen: subprocess.Popen[bytes]) -> int | None:
    """The exit status of an exited child without reaping it (it stays a zombie); ``None`` while it runs."""
    if popen.returncode is not None:
        return popen.returncode
    try:
        info = os.waitid(os.P_PID, popen.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG)
    except ChildProcessError:
        return popen.poll()  # reaped elsewhere
    if info is None or info.si_pid != popen.pid:
        return None
    return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status


def _exited_unreaped(popen: subprocess.Popen[bytes], timeout: float) -> bool:
    """Wait up to ``timeout`` for the child to exit, without reaping it."""
    deadline = time.monotonic() + timeout
    while _peek(popen) is None:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def _reap(child: ManagedChild, grace: float) -> int | None:
    """Stop ``child`` and its process group (SIGTERM, SIGKILL after ``grace``), reap it, release its guard.

    The group is signalled only while the leader is not yet reaped (alive or a zombie), so its id
    cannot belong to an unrelated process.
    """
    popen = child.popen
    if popen.returncode is None:
        if _peek(popen) is None:
            _signal_group(popen.pid, signal.SIGTERM)
            if not _exited_unreaped(popen, grace):
                _signal_group(popen.pid, signal.SIGKILL)
                _exited_unreaped(popen, KILL_WAIT_S)
        if popen.returncode is None:
            _signal_group(popen.pid, signal.SIGKILL)  # members that outlived the leader
        popen.wait()
    child.release()
    return popen.returncode


def _release_files(cleanup_dir: str | None, owner_fd: int | None) -> None:
    if cleanup_dir is not None:
        shutil.rmtree(cleanup_dir, ignore_errors=True)
    if owner_fd is not None:
        with contextlib.suppress(OSError):
            os.close(owner_fd)


def _finalize(child: ManagedChild, cleanup_dir: str | None, owner_fd: int | None) -> None:
    """The garbage-collection / interpreter-exit path: must not reference the :class:`ManagedProcess`."""
    try:
        _reap(child, FINALIZE_GRACE_S)
    finally:
        _release_files(cleanup_dir, owner_fd)


# -- registry and signals -----------------------------------------------------------------------

_REGISTRY: weakref.WeakSet[ManagedProcess] = weakref.WeakSet()
_REGISTRY_LOCK = threading.RLock()  # re-entrant: signal handlers run on the main thread
_PREVIOUS_HANDLERS: dict[int, Any] = {}
_SIGNALS_LOCK = threading.Lock()


def live_children() -> list[ManagedProcess]:
    """Started processes that have not been stopped and are still running."""
    with _REGISTRY_LOCK:
        procs = list(_REGISTRY)
    return [p for p in procs if p.alive()]


def stop_all(timeout: float = 5.0) -> None:
    """Stop and reap every registered (started, not yet stopped) child; best effort."""
    with _REGISTRY_LOCK:
        procs = list(_REGISTRY)
    for p in procs:
        with contextlib.suppress(Exception):
            p.stop(timeout=timeout)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    stop_all()
    prev = _PREVIOUS_HANDLERS.get(signum, signal.SIG_DFL)
    if callable(prev):
        prev(signum, frame)
        return
    if prev == signal.SIG_IGN:
        return
    # Default disposition: restore it and re-deliver, so the exit status reflects the signal.
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def install_signal_cleanup(signals: Iterable[signal.Signals] | None = None) -> bool:
    """Stop all children on ``signals`` (default SIGINT, SIGTERM, SIGHUP), then chain to the previous handler;
    and at interpreter exit.

    A signal the process was started ignoring (``nohup``'s SIGHUP, SIGINT in a background job)
    stays ignored: nothing is taken over for it. Idempotent. Returns False (installing nothing)
    when not called from the main thread, where Python does not allow installing signal handlers.
    """
    if threading.current_thread() is not threading.main_thread():
        return False
    wanted = list(signals) if signals is not None else [signal.SIGINT, signal.SIGTERM]
    if signals is None and hasattr(signal, "SIGHUP"):
        wanted.append(signal.SIGHUP)
    with _SIGNALS_LOCK:
        if not _PREVIOUS_HANDLERS:
            atexit.register(stop_all)
        for sig in wanted:
            current = signal.getsignal(sig)
            if current is _on_signal or current is signal.SIG_IGN:
                continue
            _PREVIOUS_HANDLERS[int(sig)] = current
            signal.signal(sig, _on_signal)
    return True


# -- the process --------------------------------------------------------------------------------


class ManagedProcess:
    """One managed backend child (see the module docstring). Use :meth:`start`/:meth:`stop` or ``with``."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        log_path: str | os.PathLike[str],
        name: str = "backend",
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        record_dir: Path | None = None,
        secrets: Sequence[str] = (),
        stop_timeout: float = 10.0,
        cleanup_dir: str | os.PathLike[str] | None = None,
        owner_fd: int | None = None,
        error_type: type[BackendStartupError] = BackendStartupError,
        guard: Guard | None = None,
        launch: Reservation | None = None,
    ) -> None:
        """Configure (nothing runs until :meth:`start`).

        ``name`` labels errors (``"<name> did not become healthy ..."``). ``env`` replaces the
        environment (``None``: inherit). ``record_dir`` receives the child's record
        (:func:`~werk_host.backends.child.spawn`). ``secrets`` are redacted from every log tail.
        ``cleanup_dir`` (removed) and ``owner_fd`` (closed) become this object's: they are released
        once the child is reaped, or by :meth:`stop`/a failed :meth:`start`. With ``launch`` (the
        :func:`~werk_host.backends.launch.reserve` whose values ``argv`` and ``env`` use), a child
        prestarted from the remembered launch is adopted when it is exactly this one, and the
        child is remembered once ready (:mod:`werk_host.backends.launch`).
        """
        self.argv = [str(a) for a in argv]
        self.name = name
        self.log_path = Path(log_path)
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.record_dir = record_dir
        self.secrets = tuple(s for s in secrets if s)
        self.stop_timeout = stop_timeout
        self.error_type = error_type
        self.guard = guard
        self.launch = launch
        self.started_at: float | None = None
        self._cleanup_dir = os.fspath(cleanup_dir) if cleanup_dir is not None else None
        self._owner_fd = owner_fd
        self._child: ManagedChild | None = None
        self._stopped = False
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._lock = threading.RLock()

    # -- introspection ----------------------------------------------------------------------

    @property
    def child(self) -> ManagedChild | None:
        return self._child

    @property
    def pid(self) -> int | None:
        """The child's pid (the id of its process group), once started."""
        return self._child.pid if self._child is not None else None

    @property
    def returncode(self) -> int | None:
        """The exit status once the child exited (negative: killed by that signal); ``None`` while it runs."""
        return _peek(self._child.popen) if self._child is not None else None

    def alive(self) -> bool:
        """True while the child runs (it may not be ready yet)."""
        return self._child is not None and _peek(self._child.popen) is None

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The redacted end of the child's log (``""`` before it exists)."""
        return read_log_tail(self.log_path, lines, secrets=self.secrets)

    def startup_error(self, reason: str, *, returncode: int | None = None) -> BackendStartupError:
        """The typed startup error for ``reason``, with the current log tail and exit status."""
        rc = self.returncode if returncode is None else returncode
        return self.error_type(reason, log_tail=self.log_tail(), returncode=rc, argv=self.argv, name=self.name)

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> ManagedProcess:
        """Spawn the child (see the module docstring); returns at once, without waiting for readiness."""
        with self._lock:
            if self._child is not None or self._stopped:
                raise BackendProcessError(f"{self.name} process already started")
            adopted = self._adopt()
            if adopted is not None:
                self._started(*adopted)
                return self
            try:
                fd = os.open(
                    self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
                )
                try:
                    child = spawn(
                        self.argv,
                        env=self.env,
                        cwd=self.cwd,
                        stdin=subprocess.DEVNULL,
                        stdout=fd,
                        stderr=subprocess.STDOUT,
                        record_dir=self.record_dir,
                        guard=self.guard,
                    )
                finally:
                    os.close(fd)
            except OSError as exc:
                self._stopped = True
                self._release()
                raise self.error_type(
                    f"cannot execute {self.argv[0]}: {exc.strerror or exc}",
                    log_tail="",
                    returncode=None,
                    argv=self.argv,
                    name=self.name,
                ) from exc
            except BaseException:
                self._stopped = True
                self._release()
                raise
            self._started(child, time.monotonic())
        return self

    def _cwd(self) -> str:
        return os.fspath(self.cwd) if self.cwd is not None else os.getcwd()

    def _adopt(self) -> tuple[ManagedChild, float] | None:
        if self.launch is None:
            return None
        return self.launch.adopt(self.argv, self.env, self._cwd(), str(self.log_path), self.guard)

    def _started(self, child: ManagedChild, started_at: float) -> None:
        self._child = child
        self.started_at = started_at
        self._finalizer = weakref.finalize(self, _finalize, child, self._cleanup_dir, self._owner_fd)
        with _REGISTRY_LOCK:
            _REGISTRY.add(self)

    def wait_ready(self, ready: Callable[[], bool], *, timeout: float, what: str = "become healthy") -> None:
        """Poll ``ready()`` until it returns True; on any failure stop the child and raise the startup error.

        Fails when the child exits (``"<name> exited with status N during startup"``), when
        ``timeout`` seconds pass (``"<name> did not <what> within <timeout>s"``), or when
        ``ready`` raises (that exception is chained).
        """
        if self._child is None:
            raise BackendProcessError(f"{self.name} process not started")
        deadline = time.monotonic() + timeout
        loading_since = self.started_at if self.started_at is not None else time.monotonic()
        log_size = _size(self.log_path)
        burst: Iterator[float] = iter(())
        try:
            while True:
                rc = self.returncode
                if rc is not None:
                    raise self.startup_error(f"{self.name} exited with status {rc} during startup", returncode=rc)
                try:
                    if ready():
                        break
                except Exception as exc:
                    raise self.startup_error(f"{self.name} readiness check failed: {exc}") from exc
                probed = time.monotonic()
                if probed >= deadline:
                    raise self.startup_error(f"{self.name} did not {what} within {timeout:g}s")
                delay = next(burst, None)
                if delay is None:
                    delay = min(_POLL_MAX_S, max(_POLL_MIN_S, (probed - loading_since) * _POLL_SHARE))
                grown = self._await_log(min(probed + delay, deadline), log_size)
                if grown is not None:
                    log_size, burst = grown, iter(_LOG_PROBES_S)
        except BaseException:
            self.stop()
            raise
        if self.launch is not None:
            args = (self.argv, self.env, self._cwd(), str(self.log_path), self.guard, self._child.pid)
            self.launch.remember(*args)

    def _await_log(self, due: float, size: int) -> int | None:
        """Sleep until ``due``; the log's new size as soon as it is no longer ``size``, else ``None``."""
        while (now := time.monotonic()) < due:
            time.sleep(min(_LOG_WATCH_S, due - now))
            if (current := _size(self.log_path)) != size:
                return current
        return None

    def stop(self, timeout: float | None = None) -> int | None:
        """SIGTERM the group, SIGKILL after ``timeout`` (default ``stop_timeout``) s, reap, release files.

        Idempotent; returns the exit status (``None`` if never started).
        """
        with self._lock:
            child = self._child
            if self._stopped:
                return child.popen.returncode if child is not None else None
            self._stopped = True
            if self._finalizer is not None:
                self._finalizer.detach()
                self._finalizer = None
            try:
                rc = _reap(child, self.stop_timeout if timeout is None else timeout) if child is not None else None
            finally:
                self._release()
                with _REGISTRY_LOCK:
                    _REGISTRY.discard(self)
            return rc

    def _release(self) -> None:
        cleanup_dir, self._cleanup_dir = self._cleanup_dir, None
        owner_fd, self._owner_fd = self._owner_fd, None
        _release_files(cleanup_dir, owner_fd)

    def __enter__(self) -> ManagedProcess:
        if self._child is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "alive" if self.alive() else ("stopped" if self._child is not None else "new")
        return f"<ManagedProcess {self.name} {state} pid={self.pid}>"

"""Managing one ``llama-server`` child process.

:class:`LlamaServerProcess` starts exactly one child::

    llama-server --host 127.0.0.1 --port <free port> -m MODEL -np N -c CTX
                 --slot-save-path <private dir> [--no-warmup | --warmup]
                 [-t THREADS] [extra_args...] [WERK_LLAMA_ARGS...]

* Every *generated* flag is checked against the executable's ``--help`` before
  spawning (:meth:`werk_llamacpp.binary.BinaryInfo.verify_flags`).
* ``--no-warmup`` is emitted when advertised; a positive ``warmup_tokens``
  emits ``--warmup`` instead (the native switch is boolean, the count is not
  forwarded). Old runtimes without these flags keep their default.
* ``WERK_LLAMA_ARGS`` (``shlex``-split) is appended last, so it overrides any
  generated setting; :meth:`LlamaServerProcess.effective_parallel` and
  :meth:`LlamaServerProcess.effective_slot_save_path` read the final argv.
* The child environment drops the inherited ``LLAMA_ARG_*`` and
  ``LLAMA_API_KEY`` so the argv is the only configuration channel, and then
  sets ``LLAMA_API_KEY`` to a random key made for this process alone: every
  endpoint but ``/health`` and ``/v1/health`` answers 401 without
  ``Authorization: Bearer <key>``, so other local users cannot drive the
  child. The key travels in the environment (readable only by the same user)
  and never in the argv (visible to all users), is verified to be what the
  executable's help lists for ``--api-key``, and appears in no log, error,
  repr or fingerprint. Werk's own clients get it from
  :meth:`LlamaServerProcess.new_client` and :attr:`LlamaServerProcess.api_key`.
* The child is a :mod:`werk_host.backends.child` managed child: it dies with
  the process that started it, SIGKILL of that process included.
* The slot-save directory, the native log and the child's record
  (``child.json``) live in a private (0700) per-generation run directory
  ``<work_dir>/gen-<generation>/``, held with the ``werk cache`` owner lock
  while the process runs; it is removed on :meth:`LlamaServerProcess.stop`
  unless ``keep_files``. Each start in an explicit ``work_dir`` first stops
  the recorded children of, and removes, every ``gen-*`` directory whose
  owner is gone (:func:`werk_host.backends.child.reap_stale_run_dirs`); kept
  files last until then.
* Startup waits for ``GET /health`` == 200 with a timeout. Any failure (exit,
  timeout, changed executable) stops the child and raises
  :class:`LlamaServerStartupError` carrying the tail of the native log. There
  is no retry.
* Fingerprints: executable SHA-256 and help hash (from
  :func:`~werk_llamacpp.binary.inspect_executable`), :attr:`args_hash` over
  the effective arguments (port and private paths normalized), and a random
  :attr:`generation` per started process.

Cleanup: every started process is tracked in a weak registry, reaped by a
``weakref.finalize`` if it is garbage collected or at interpreter exit, and
:func:`install_signal_cleanup` stops all children on SIGINT, SIGTERM and
SIGHUP before the previous handler runs (gracefully). When the parent dies
without cleaning up (SIGKILL, a crash), the managed-child guard kills the
child, and the next start in the same ``work_dir`` removes its directory.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import IO, Any

from werk_host.backends.child import ManagedChild, create_run_dir, reap_stale_run_dirs, spawn

from .binary import BinaryInfo, ExecutableIdentity, find_llama_server, inspect_executable, parse_help_flags
from .native import LlamaServerClient, NativeConnectionError, NativeError

__all__ = [
    "ENV_ARGS",
    "LOG_TAIL_LINES",
    "LlamaServerError",
    "LlamaServerProcess",
    "LlamaServerStartupError",
    "PrivateDirError",
    "advertised_env",
    "effective_args_hash",
    "ensure_private_dir",
    "free_port",
    "install_signal_cleanup",
    "last_flag_value",
    "live_processes",
    "read_log_tail",
    "stop_all",
]

ENV_ARGS = "WERK_LLAMA_ARGS"
LOG_TAIL_LINES = 40
_PARALLEL_FLAGS = ("-np", "--parallel")
_SLOT_SAVE_FLAGS = ("--slot-save-path",)
_PORT_FLAGS = ("--port",)
_STRIPPED_ENV_PREFIXES = ("LLAMA_ARG_",)
_API_KEY_FLAG = "--api-key"
_API_KEY_ENV = "LLAMA_API_KEY"
_STRIPPED_ENV = (_API_KEY_ENV,)
_RUN_DIR_PREFIX = "gen-"
_HELP_ENV = re.compile(r"\(env: ([A-Za-z0-9_]+)\)")


class LlamaServerError(RuntimeError):
    """Base class for llama-server process errors."""


class PrivateDirError(LlamaServerError):
    """A directory that must be private is a symlink, not ours, or not a directory."""


class LlamaServerStartupError(LlamaServerError):
    """llama-server did not become healthy; ``log_tail`` holds the end of its native log."""

    def __init__(self, message: str, *, log_tail: str, returncode: int | None, argv: Sequence[str]) -> None:
        full = f"{message}\n--- llama-server log (tail) ---\n{log_tail}" if log_tail else message
        super().__init__(full)
        self.reason = message
        self.log_tail = log_tail
        self.returncode = returncode
        self.argv = list(argv)


# -- helpers ----------------------------------------------------------------------


def ensure_private_dir(path: str | os.PathLike[str]) -> Path:
    """Create ``path`` (and parents) if needed; make sure it is a real directory owned by us with mode 0700."""
    p = Path(path)
    p.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(p)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise PrivateDirError(f"{p} is not a plain directory")
    if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
        raise PrivateDirError(f"{p} is not owned by the current user")
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(p, 0o700)
    return p


def free_port(host: str = "127.0.0.1") -> int:
    """An ephemeral TCP port that is free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def last_flag_value(argv: Sequence[str], names: Iterable[str]) -> str | None:
    """Value of the last occurrence of any of ``names`` (``-x V`` or ``-x=V``) in ``argv``."""
    wanted = tuple(names)
    value: str | None = None
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in wanted:
            if i + 1 < len(argv):
                value = argv[i + 1]
            i += 2
            continue
        if "=" in arg and arg.split("=", 1)[0] in wanted:
            value = arg.split("=", 1)[1]
        i += 1
    return value


def effective_args_hash(args: Sequence[str]) -> str:
    """SHA-256 of the effective argument list (without the executable).

    The values of ``--port`` and ``--slot-save-path`` are replaced by
    placeholders: they are per-process plumbing, not behaviour, and would
    otherwise make every process look different.
    """
    norm: list[str] = []
    skip_value_for: str | None = None
    for arg in args:
        if skip_value_for is not None:
            norm.append(f"<{skip_value_for}>")
            skip_value_for = None
            continue
        name = arg.split("=", 1)[0]
        if name in _PORT_FLAGS + _SLOT_SAVE_FLAGS:
            if "=" in arg:
                norm.append(f"{name}=<{name.lstrip('-')}>")
            else:
                norm.append(arg)
                skip_value_for = name.lstrip("-")
            continue
        norm.append(arg)
    return hashlib.sha256(json.dumps(norm, separators=(",", ":")).encode("utf-8")).hexdigest()


def read_log_tail(path: str | os.PathLike[str], lines: int = LOG_TAIL_LINES, *, max_bytes: int = 256 * 1024) -> str:
    """The last ``lines`` lines of a log file (bytes-safe, bounded read)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:])


def advertised_env(help_text: str, flag: str) -> str | None:
    """The environment variable llama.cpp-style ``--help`` lists for ``flag`` (``(env: NAME)``), or None.

    The note follows the option line, on it or on one of its indented continuation lines.
    """
    lines = help_text.splitlines()
    for i, line in enumerate(lines):
        if not line.startswith("-") or flag not in parse_help_flags(line):
            continue
        block = [line]
        for more in lines[i + 1 :]:
            if not more[:1].isspace():
                break
            block.append(more)
        found = _HELP_ENV.search("\n".join(block))
        return found.group(1) if found else None
    return None


def _child_env(base: Mapping[str, str], api_key: str) -> dict[str, str]:
    env = {k: v for k, v in base.items() if not k.startswith(_STRIPPED_ENV_PREFIXES) and k not in _STRIPPED_ENV}
    env[_API_KEY_ENV] = api_key
    return env


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _exited_unreaped(pid: int, timeout: float) -> bool:
    """Wait up to ``timeout`` for ``pid`` to exit without reaping it (it stays a zombie)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG)
        except ChildProcessError:
            return True  # already reaped elsewhere
        if info is not None and info.si_pid == pid:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def _reap(child: ManagedChild, grace: float, cleanup_dir: str | None) -> int | None:
    """Terminate, then kill, and reap ``child`` and its process group; release its guard; remove ``cleanup_dir``.

    The child leads its own session/process group. The group is signalled only
    while the leader is not yet reaped (alive or a zombie), so its id cannot
    have been reused by an unrelated process.
    """
    popen = child.popen
    if popen.returncode is None:
        _signal_group(popen.pid, signal.SIGTERM)
        if not _exited_unreaped(popen.pid, grace):
            _signal_group(popen.pid, signal.SIGKILL)
            _exited_unreaped(popen.pid, 30.0)
        # Stragglers of the child's own group (none expected for llama-server).
        if popen.returncode is None:
            _signal_group(popen.pid, signal.SIGKILL)
        popen.wait()
    child.release()
    if cleanup_dir is not None:
        shutil.rmtree(cleanup_dir, ignore_errors=True)
    return popen.returncode


# -- registry and signals -------------------------------------------------------------

_REGISTRY: weakref.WeakSet[LlamaServerProcess] = weakref.WeakSet()
_REGISTRY_LOCK = threading.RLock()  # re-entrant: signal handlers run on the main thread
_PREVIOUS_HANDLERS: dict[int, Any] = {}
_SIGNALS_LOCK = threading.Lock()


def live_processes() -> list[LlamaServerProcess]:
    """Started processes that have not been stopped yet."""
    with _REGISTRY_LOCK:
        return [p for p in _REGISTRY if p.alive()]


def stop_all(timeout: float = 5.0) -> None:
    """Stop and reap every registered llama-server child."""
    with _REGISTRY_LOCK:
        procs = list(_REGISTRY)
    for p in procs:
        with contextlib.suppress(Exception):  # best effort during shutdown
            p.stop(timeout=timeout)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    stop_all()
    prev = _PREVIOUS_HANDLERS.get(signum, signal.SIG_DFL)
    if callable(prev):
        prev(signum, frame)
        return
    if prev == signal.SIG_IGN:
        return
    # Default disposition: restore it and re-deliver so the exit status reflects the signal.
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def install_signal_cleanup(
    signals: Iterable[signal.Signals] | None = None,
) -> bool:
    """Stop all children on SIGINT/SIGTERM/SIGHUP (then chain to the previous handler) and at exit.

    Idempotent. Returns False (and installs nothing) when not called from the
    main thread, where Python does not allow installing signal handlers.
    """
    if threading.current_thread() is not threading.main_thread():
        return False
    wanted = list(signals) if signals is not None else [signal.SIGINT, signal.SIGTERM]
    if signals is None and hasattr(signal, "SIGHUP"):
        wanted.append(signal.SIGHUP)
    with _SIGNALS_LOCK:
        if not _PREVIOUS_HANDLERS:
            import atexit

            atexit.register(stop_all)
        for sig in wanted:
            current = signal.getsignal(sig)
            if current is _on_signal:
                continue
            _PREVIOUS_HANDLERS[int(sig)] = current
            signal.signal(sig, _on_signal)
    return True


# -- the process -------------------------------------------------------------------


class LlamaServerProcess:
    """One managed llama-server child. Use :meth:`start`/:meth:`stop` or a ``with`` block."""

    def __init__(
        self,
        model: str | os.PathLike[str],
        *,
        binary: str | os.PathLike[str] | None = None,
        parallel: int = 1,
        ctx: int = 4096,
        work_dir: str | os.PathLike[str] | None = None,
        warmup_tokens: int = 0,
        threads: int | None = None,
        extra_args: Sequence[str] = (),
        env_args: str | None = None,
        host: str = "127.0.0.1",
        startup_timeout: float = 120.0,
        stop_timeout: float = 10.0,
        keep_files: bool = False,
        slot_save: bool = True,
    ) -> None:
        """Configure (nothing starts until :meth:`start`).

        ``ctx`` is the total context passed as ``-c`` (llama-server divides it
        among ``parallel`` slots unless the KV cache is unified).
        ``env_args`` defaults to ``$WERK_LLAMA_ARGS``. ``work_dir`` is the
        private parent of the per-generation run directory (default: a fresh
        temporary directory removed on stop). ``slot_save=False`` omits
        ``--slot-save-path`` (slot save/restore then is unusable).
        """
        if parallel < 1 or ctx < 1:
            raise ValueError("parallel and ctx must be positive")
        self.model = Path(model).absolute()
        self._binary_arg = binary
        self.parallel = parallel
        self.ctx = ctx
        self.warmup_tokens = warmup_tokens
        self.threads = threads
        self.extra_args = list(extra_args)
        raw_env = os.environ.get(ENV_ARGS, "") if env_args is None else env_args
        self.env_args = shlex.split(raw_env)
        self.host = host
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.keep_files = keep_files
        self.slot_save = slot_save
        self._work_dir_arg = work_dir

        self.generation: str = ""
        self.binary: BinaryInfo | None = None
        self.port: int | None = None
        self.argv: list[str] = []
        self.generated_args: list[str] = []
        self.args_hash: str = ""
        self.run_dir: Path | None = None
        self.slot_dir: Path | None = None
        self.log_path: Path | None = None
        self.client: LlamaServerClient | None = None
        self.started_at: float | None = None
        self.total_slots: int | None = None
        """Slot count the running server reports (``/props`` ``total_slots``), read once after startup."""
        self._child: ManagedChild | None = None
        self._popen: subprocess.Popen[bytes] | None = None
        self._api_key = ""
        self._stopped = False
        self._log_fh: IO[bytes] | None = None
        self._cleanup_dir: str | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._lock = threading.RLock()
        self._owner_fd: int | None = None

    # -- introspection ----------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return self._popen.pid if self._popen is not None else None

    @property
    def returncode(self) -> int | None:
        return self._popen.poll() if self._popen is not None else None

    @property
    def base_url(self) -> str:
        if self.port is None:
            raise LlamaServerError("process not started")
        return f"http://{self.host}:{self.port}"

    def alive(self) -> bool:
        """True while the child runs (it may still be loading)."""
        return self._popen is not None and self._popen.poll() is None

    @property
    def api_key(self) -> str:
        """The secret key the child requires (``Authorization: Bearer``); never log or show it."""
        if not self._api_key:
            raise LlamaServerError("process not started")
        return self._api_key

    def new_client(self, *, timeout: float = 120.0, n_slots: int | None = None) -> LlamaServerClient:
        """A fresh client for this child that authenticates every request (the caller closes it)."""
        if self.port is None:
            raise LlamaServerError("process not started")
        return LlamaServerClient(self.host, self.port, timeout=timeout, n_slots=n_slots, api_key=self.api_key)

    def effective_parallel(self) -> int:
        """Number of slots the final argv selects (last ``-np``/``--parallel`` wins; llama-server default 1)."""
        value = last_flag_value(self.argv[1:] if self.argv else self._planned_tail(), _PARALLEL_FLAGS)
        if value is None:
            return 1
        try:
            return int(value)
        except ValueError:
            return -1

    def effective_slot_save_path(self) -> Path | None:
        """The ``--slot-save-path`` the final argv selects, or None."""
        value = last_flag_value(self.argv[1:] if self.argv else self._planned_tail(), _SLOT_SAVE_FLAGS)
        return Path(value) if value else None

    def fingerprints(self) -> dict[str, str]:
        """Executable SHA-256, help hash, effective-argument hash and process generation."""
        if self.binary is None:
            raise LlamaServerError("process not started")
        return {
            "executable_sha256": self.binary.sha256,
            "help_sha256": self.binary.help_sha256,
            "args_sha256": self.args_hash,
            "generation": self.generation,
        }

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        if self.log_path is None:
            return ""
        if self._log_fh is not None:
            self._log_fh.flush()
        return read_log_tail(self.log_path, lines)

    def _planned_tail(self) -> list[str]:
        return [*self.generated_args, *self.extra_args, *self.env_args]

    # -- arguments ------------------------------------------------------------------------

    def build_generated_args(self, info: BinaryInfo, port: int, slot_dir: Path | None) -> list[str]:
        """The flags Werk itself generates (before ``extra_args`` and ``WERK_LLAMA_ARGS``)."""
        args = [
            "--host",
            self.host,
            "--port",
            str(port),
            "-m",
            str(self.model),
            "-np",
            str(self.parallel),
            "-c",
            str(self.ctx),
        ]
        if slot_dir is not None:
            args += ["--slot-save-path", str(slot_dir)]
        if self.warmup_tokens > 0:
            if info.advertises("--warmup"):
                args.append("--warmup")
        elif info.advertises("--no-warmup"):
            args.append("--no-warmup")
        if self.threads is not None:
            args += ["-t", str(self.threads)]
        return args

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> LlamaServerProcess:
        """Spawn the child and wait until ``/health`` answers 200; raises on any failure."""
        with self._lock:
            if self._popen is not None:
                raise LlamaServerError("process already started")
            path = find_llama_server(self._binary_arg)
            info = inspect_executable(path)
            self.binary = info
            self.generation = secrets.token_hex(16)
            self._api_key = secrets.token_urlsafe(32)

            try:
                if self._work_dir_arg is None:
                    work = Path(tempfile.mkdtemp(prefix="werk-llama-"))
                    self._cleanup_dir = str(work)
                else:
                    work = ensure_private_dir(self._work_dir_arg)
                    reap_stale_run_dirs(work, prefix=_RUN_DIR_PREFIX, grace=self.stop_timeout)
                # Locked from the start: `werk cache` and other owners see the directory as active.
                run_dir, self._owner_fd = create_run_dir(work, f"{_RUN_DIR_PREFIX}{self.generation}")
                if self._cleanup_dir is None:
                    self._cleanup_dir = str(run_dir)
                self.run_dir = run_dir
                self.slot_dir = ensure_private_dir(run_dir / "slots") if self.slot_save else None
                self.log_path = run_dir / "llama-server.log"

                self.port = free_port(self.host)
                self.generated_args = self.build_generated_args(info, self.port, self.slot_dir)
                info.verify_flags(self.generated_args)
                if advertised_env(info.help_text, _API_KEY_FLAG) != _API_KEY_ENV:
                    raise LlamaServerError(
                        f"{info.path} does not read {_API_KEY_FLAG} from {_API_KEY_ENV}; "
                        "Werk does not run llama-server without an API key"
                    )
                tail = [*self.generated_args, *self.extra_args, *self.env_args]
                self.argv = [str(info.path), *tail]
                self.args_hash = effective_args_hash(tail)
                final_port = last_flag_value(tail, _PORT_FLAGS)
                if final_port is not None and final_port.isdigit():
                    self.port = int(final_port)

            except BaseException:
                self._remove_files()
                raise
            fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
            self._log_fh = os.fdopen(fd, "ab", buffering=0)
            try:
                self._child = spawn(
                    self.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=self._log_fh,
                    stderr=subprocess.STDOUT,
                    env=_child_env(os.environ, self._api_key),
                    cwd=run_dir,
                    record_dir=run_dir,
                )
            except OSError as exc:
                self._log_fh.close()
                self._log_fh = None
                self._remove_files()
                raise LlamaServerStartupError(
                    f"cannot execute {info.path}: {exc}", log_tail="", returncode=None, argv=self.argv
                ) from exc
            self._popen = self._child.popen
            self.started_at = time.monotonic()
            self._finalizer = weakref.finalize(
                self, _reap, self._child, 2.0, None if self.keep_files else self._cleanup_dir
            )
            with _REGISTRY_LOCK:
                _REGISTRY.add(self)
            self.client = self.new_client()
        try:
            self._wait_healthy()
            if ExecutableIdentity.of(info.path) != info.identity:
                raise self._startup_error("llama-server executable changed while the process started")
            self.total_slots = self._read_total_slots()
            eff = self.effective_parallel()
            self.client.n_slots = self.total_slots if self.total_slots is not None else (eff if eff > 0 else None)
        except BaseException:
            self.stop()
            raise
        return self

    def _read_total_slots(self) -> int | None:
        assert self.client is not None
        try:
            total = self.client.props().get("total_slots")
        except NativeError:
            return None
        return total if isinstance(total, int) and not isinstance(total, bool) and total > 0 else None

    def _startup_error(self, reason: str) -> LlamaServerStartupError:
        return LlamaServerStartupError(reason, log_tail=self.log_tail(), returncode=self.returncode, argv=self.argv)

    def _wait_healthy(self) -> None:
        assert self.client is not None and self._popen is not None
        deadline = time.monotonic() + self.startup_timeout
        delay = 0.02
        while True:
            rc = self._popen.poll()
            if rc is not None:
                raise self._startup_error(f"llama-server exited with status {rc} during startup")
            try:
                if self.client.health(timeout=2.0):
                    return
            except NativeConnectionError:
                pass
            if time.monotonic() >= deadline:
                raise self._startup_error(f"llama-server did not become healthy within {self.startup_timeout:g}s")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.25)

    def stop(self, timeout: float | None = None) -> int | None:
        """Terminate (SIGTERM), then kill after ``timeout`` seconds, and reap. Idempotent. Returns the exit status."""
        with self._lock:
            child = self._child
            if child is None:
                return None
            if self._stopped:
                return child.popen.returncode
            self._stopped = True
            if self.client is not None:
                self.client.close()
            if self._finalizer is not None:
                self._finalizer.detach()
                self._finalizer = None
            rc = _reap(child, self.stop_timeout if timeout is None else timeout, None)
            if self._log_fh is not None:
                self._log_fh.close()
                self._log_fh = None
            self._remove_files()
            with _REGISTRY_LOCK:
                _REGISTRY.discard(self)
            return rc

    def _remove_files(self) -> None:
        if not self.keep_files and self._cleanup_dir is not None:
            shutil.rmtree(self._cleanup_dir, ignore_errors=True)
        if self._owner_fd is not None:
            os.close(self._owner_fd)
            self._owner_fd = None

    def __enter__(self) -> LlamaServerProcess:
        if self._popen is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "alive" if self.alive() else ("stopped" if self._popen is not None else "new")
        return f"<LlamaServerProcess {state} pid={self.pid} port={self.port} model={self.model.name}>"

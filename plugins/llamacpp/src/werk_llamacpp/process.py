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
* The child is a :class:`werk_host.plugin.process.ManagedProcess`: it dies with the
  process that started it (SIGKILL of that process included), leads its own process group,
  is stopped with that group, and is registered for the host's signal/exit cleanup; a
  garbage-collected process is reaped.
* The slot-save directory, the native log and the child's record
  (``child.json``) live in a private (0700) per-generation run directory
  ``<work_dir>/gen-<generation>/``, held with the ``werk cache`` owner lock
  while the process runs; it is removed on :meth:`LlamaServerProcess.stop`
  unless ``keep_files``. Each start in an explicit ``work_dir`` first stops
  the recorded children of, and removes, every ``gen-*`` directory whose
  owner is gone (:func:`werk_host.plugin.process.reap_stale_run_dirs`); kept
  files last until then.
* Startup waits for ``GET /health`` == 200 with a timeout
  (:meth:`~werk_host.plugin.process.ManagedProcess.wait_ready`). Any failure (exit,
  timeout) stops the child and raises :class:`LlamaServerStartupError` carrying the tail
  of the native log, the API key redacted. There is no retry. Once ready, the executable
  is hashed again beside the first requests (:class:`~werk_llamacpp.binary.ExecutableCheck`):
  a changed file turns native persistence off for this child
  (:meth:`LlamaServerProcess.persistence_off`; the clients' slot saves and restores wait for
  the check and then raise :class:`~werk_llamacpp.native.NativePersistenceOff`).
* Before the child spawns (the argv final), the CPU expert page preparation
  (:mod:`werk_llamacpp.prefetch`, ``WERK_LLAMA_PREFETCH``) may map and populate the pages of
  the MoE expert tensors the argv places on the CPU; its outcome is
  :attr:`LlamaServerProcess.prefetch`. What it keeps mapped (with its own lease on the model
  files) lives as long as the child: :meth:`LlamaServerProcess.stop` cancels a preparation in
  progress and, once the child is reaped, unmaps and releases it. An unknown
  ``WERK_LLAMA_PREFETCH`` is a startup error; nothing else of it ever fails a start.
* Fingerprints: executable SHA-256 and help hash (from
  :func:`~werk_llamacpp.binary.inspect_executable`), :attr:`args_hash` over
  the effective arguments (port and private paths normalized),
  :attr:`kv_args_hash` over those that can affect KV state
  (:func:`kv_layout_args_hash`), and a random :attr:`generation` per started
  process.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shlex
import shutil
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from werk_host.plugin import ensure_private_dir
from werk_host.plugin.process import (
    LOG_TAIL_LINES,
    BackendProcessError,
    BackendStartupError,
    ManagedProcess,
    public_log_lines,
    reap_stale_run_dirs,
    reserve,
)

from . import prefetch as _prefetch
from .binary import BinaryInfo, ExecutableCheck, find_llama_server, inspect_executable, parse_help_flags
from .modelfiles import ExtraFiles
from .native import LlamaServerClient, NativeConnectionError, NativeError, NativePersistenceOff

log = logging.getLogger(__name__)

__all__ = [
    "ENV_ARGS",
    "LlamaServerError",
    "LlamaServerProcess",
    "LlamaServerStartupError",
    "advertised_env",
    "effective_args_hash",
    "kv_layout_args_hash",
    "last_flag_value",
]

ENV_ARGS = "WERK_LLAMA_ARGS"
NAME = "llama-server"
_PARALLEL_FLAGS = ("-np", "--parallel")
_SLOT_SAVE_FLAGS = ("--slot-save-path",)
_PORT_FLAGS = ("--port",)
_STRIPPED_ENV_PREFIXES = ("LLAMA_ARG_",)
_API_KEY_FLAG = "--api-key"
_API_KEY_ENV = "LLAMA_API_KEY"
_STRIPPED_ENV = (_API_KEY_ENV,)
#: Flags (with a value) that cannot change what a slot's KV state holds or how it is laid out:
#: network plumbing, the private snapshot directory, the served name, thread counts and the model
#: path (the model itself is the compatibility key's ``model_identity``/``model_files``).
_KV_NEUTRAL_VALUE_FLAGS = frozenset(
    {
        "--host",
        "--port",
        "--slot-save-path",
        "-a",
        "--alias",
        "-t",
        "--threads",
        "-tb",
        "--threads-batch",
        "--threads-http",
        "-m",
        "--model",
    }
)
#: Switches that cannot change a slot's KV state: metrics and the (boolean) native warmup.
_KV_NEUTRAL_SWITCHES = frozenset({"--metrics", "--warmup", "--no-warmup"})
_RUN_DIR_PREFIX = "gen-"
_HELP_ENV = re.compile(r"\(env: ([A-Za-z0-9_]+)\)")


class LlamaServerError(BackendProcessError):
    """Base class for llama-server process errors."""


class LlamaServerStartupError(LlamaServerError, BackendStartupError):
    """llama-server did not become healthy; ``log_tail`` holds the (redacted) end of its native log."""


# -- helpers ----------------------------------------------------------------------


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


def kv_layout_args_hash(args: Sequence[str]) -> str:
    """SHA-256 of the effective arguments that can affect a slot's KV state and layout.

    Every argument counts except the few that provably cannot (the module's
    ``_KV_NEUTRAL_VALUE_FLAGS`` with their values and ``_KV_NEUTRAL_SWITCHES``): context size,
    slot count, cache types, unified KV, rope and offload settings all stay in. This is the
    ``kv_args_sha256`` dimension of the llama.cpp compatibility key, so a restart with
    another port, thread count or model path keeps its states restorable (docs/states.md).
    """
    kept: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        name = arg.split("=", 1)[0]
        if name in _KV_NEUTRAL_VALUE_FLAGS:
            i += 1 if "=" in arg else 2
            continue
        if arg not in _KV_NEUTRAL_SWITCHES:
            kept.append(arg)
        i += 1
    return hashlib.sha256(json.dumps(kept, separators=(",", ":")).encode("utf-8")).hexdigest()


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
        cache_release: bool = False,
    ) -> None:
        """Configure (nothing starts until :meth:`start`).

        ``ctx`` is the total context passed as ``-c`` (llama-server divides it
        among ``parallel`` slots unless the KV cache is unified).
        ``env_args`` defaults to ``$WERK_LLAMA_ARGS``. ``work_dir`` is the
        private parent of the per-generation run directory (default: a fresh
        temporary directory removed on stop). ``slot_save=False`` omits
        ``--slot-save-path`` (slot save/restore then is unusable). ``cache_release``: the files
        beyond the manifest are released with advice after the child stops (:mod:`.modelfiles`).
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
        self.kv_args_hash: str = ""
        self.run_dir: Path | None = None
        self.slot_dir: Path | None = None
        self.log_path: Path | None = None
        self.client: LlamaServerClient | None = None
        self.started_at: float | None = None
        self.total_slots: int | None = None
        """Slot count the running server reports (``/props`` ``total_slots``), read once after startup."""
        self.managed: ManagedProcess | None = None
        """The host's managed child, once :meth:`start` spawned it."""
        self.executable_check: ExecutableCheck | None = None
        """The executable checked again once the child is ready (module docstring)."""
        self.prefetch: _prefetch.Outcome | None = None
        """The last CPU expert page preparation's outcome (module docstring; ``.as_dict()``)."""
        self._preparation: _prefetch.Preparation | None = None
        self._prefetch_cancel: threading.Event | None = None
        self.cache_release = cache_release
        self._extra_files: ExtraFiles | None = None
        self._api_key = ""
        self._stopped = False
        self._lock = threading.RLock()

    # -- introspection ----------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return self.managed.pid if self.managed is not None else None

    @property
    def returncode(self) -> int | None:
        return self.managed.returncode if self.managed is not None else None

    @property
    def base_url(self) -> str:
        if self.port is None:
            raise LlamaServerError("process not started")
        return f"http://{self.host}:{self.port}"

    def alive(self) -> bool:
        """True while the child runs (it may still be loading)."""
        return self.managed is not None and self.managed.alive()

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
        return LlamaServerClient(
            self.host,
            self.port,
            timeout=timeout,
            n_slots=n_slots,
            api_key=self.api_key,
            persistence=self._persistence_allowed,
        )

    def persistence_off(self, *, wait: bool = True) -> str | None:
        """Why native persistence (slot save and restore) is off for this child: its executable
        changed since it was inspected (module docstring). ``None`` when the check passed, before
        the child was ready, or (``wait`` false) while the check runs."""
        check = self.executable_check
        return None if check is None else check.failure(wait=wait)

    def _persistence_allowed(self) -> None:
        reason = self.persistence_off()
        if reason is not None:
            raise NativePersistenceOff(reason, endpoint="/slots")

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
        """Executable SHA-256, help hash, effective-argument hashes (all, and the KV-relevant
        subset) and process generation."""
        if self.binary is None:
            raise LlamaServerError("process not started")
        return {
            "executable_sha256": self.binary.sha256,
            "help_sha256": self.binary.help_sha256,
            "args_sha256": self.args_hash,
            "kv_args_sha256": self.kv_args_hash,
            "generation": self.generation,
        }

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The end of the native log, the API key redacted."""
        return self.managed.log_tail(lines) if self.managed is not None else ""

    def public_log_tail(self, lines: int) -> list[str]:
        """The last ``lines`` lines of the native log for an operator (``werk_log_tail``): the
        startup error's redaction (the API key), and filesystem paths and process ids replaced
        (:func:`~werk_host.plugin.process.public_log_lines`)."""
        return public_log_lines(self.log_tail(lines), (self._api_key,) if self._api_key else (), lines=lines)

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
            if self.managed is not None or self._stopped:
                raise LlamaServerError("process already started")
            path = find_llama_server(self._binary_arg)
            began = time.monotonic()
            info = inspect_executable(path)
            log.info("runtime inspection: %s in %.3f s", info.path.name, time.monotonic() - began)
            self.binary = info

            cleanup_dir: str | None = None
            owner_fd: int | None = None
            try:
                if self._work_dir_arg is None:
                    work = Path(tempfile.mkdtemp(prefix="werk-llama-"))
                    cleanup_dir = str(work)
                else:
                    work = ensure_private_dir(self._work_dir_arg)
                    reap_stale_run_dirs(work, prefix=_RUN_DIR_PREFIX, grace=self.stop_timeout)
                # Locked from the start: `werk cache` and other owners see the directory as active.
                reservation = reserve(NAME, work, prefix=_RUN_DIR_PREFIX, host=self.host)
                run_dir, owner_fd = reservation.run_dir, reservation.owner_fd
                self.generation, self._api_key, self.port = reservation.generation, reservation.secret, reservation.port
                if cleanup_dir is None:
                    cleanup_dir = str(run_dir)
                self.run_dir = run_dir
                self.slot_dir = ensure_private_dir(run_dir / "slots") if self.slot_save else None
                self.log_path = run_dir / "llama-server.log"
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
                self.kv_args_hash = kv_layout_args_hash(tail)
                final_port = last_flag_value(tail, _PORT_FLAGS)
                if final_port is not None and final_port.isdigit():
                    self.port = int(final_port)
                self._extra_files = ExtraFiles(tail, self.model, release=self.cache_release)
                self._prefetch_cancel = cancel = threading.Event()
                try:
                    deadline = min(_prefetch.DEADLINE_S, self.startup_timeout)
                    self._preparation = _prefetch.prepare_for(tail, cancel=cancel, deadline_s=deadline)
                except _prefetch.PrefetchConfigError as err:
                    raise LlamaServerError(str(err)) from err
                self.prefetch = self._preparation.outcome
            except BaseException:
                self._drop_prefetch()
                if not self.keep_files and cleanup_dir is not None:
                    shutil.rmtree(cleanup_dir, ignore_errors=True)
                if owner_fd is not None:
                    os.close(owner_fd)
                raise
            # From here the managed process owns the run directory and its lock.
            self.managed = ManagedProcess(
                self.argv,
                log_path=self.log_path,
                name=NAME,
                env=_child_env(os.environ, self._api_key),
                cwd=run_dir,
                record_dir=run_dir,
                secrets=(self._api_key,),
                stop_timeout=self.stop_timeout,
                cleanup_dir=None if self.keep_files else cleanup_dir,
                owner_fd=owner_fd,
                error_type=LlamaServerStartupError,
                launch=reservation,
            )
            try:
                self.managed.start()
            except BaseException:
                self._drop_prefetch()
                raise
            self.started_at = self.managed.started_at
            self.client = self.new_client()
        try:
            waited = time.monotonic()
            self.managed.wait_ready(self._healthy, timeout=self.startup_timeout)
            log.info("native readiness: pid %s healthy after %.3f s", self.pid, time.monotonic() - waited)
            self.executable_check = ExecutableCheck(info.identity)
            self.total_slots = self._read_total_slots()
            eff = self.effective_parallel()
            self.client.n_slots = self.total_slots if self.total_slots is not None else (eff if eff > 0 else None)
        except BaseException:
            self.stop()
            raise
        return self

    def _healthy(self) -> bool:
        assert self.client is not None
        try:
            return self.client.health(timeout=2.0)
        except NativeConnectionError:
            return False

    def _read_total_slots(self) -> int | None:
        assert self.client is not None
        try:
            total = self.client.props().get("total_slots")
        except NativeError:
            return None
        return total if isinstance(total, int) and not isinstance(total, bool) and total > 0 else None

    def stop(self, timeout: float | None = None) -> int | None:
        """Terminate (SIGTERM), then kill after ``timeout`` seconds, and reap; then drop the
        prepared expert pages and their lease. Idempotent. Returns the exit status."""
        cancel = self._prefetch_cancel
        if cancel is not None:
            cancel.set()  # before the lock: a preparation in start() stops at its next chunk
        with self._lock:
            managed = self.managed
            if managed is None:
                self._drop_prefetch()
                return None
            if not self._stopped:
                self._stopped = True
                if self.client is not None:
                    self.client.close()
            try:
                return managed.stop(self.stop_timeout if timeout is None else timeout)
            finally:
                self._drop_prefetch()

    def _drop_prefetch(self) -> None:
        """Cancel, join and unmap the preparation, release its lease, then the leases of the
        files beyond the manifest (idempotent)."""
        preparation, self._preparation = self._preparation, None
        if preparation is not None:
            preparation.close()
        extra, self._extra_files = self._extra_files, None
        if extra is not None:
            extra.close()

    def __enter__(self) -> LlamaServerProcess:
        if self.managed is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "alive" if self.alive() else ("stopped" if self.managed is not None else "new")
        return f"<LlamaServerProcess {state} pid={self.pid} port={self.port} model={self.model.name}>"

"""Werk-started engine workers: one generation of an engine's HTTP server on the loopback
(docs/plugin-kit.md, "Processes").

A backend that serves a model through a server process of its own (vLLM's ``vllm serve``,
oMLX's MLX worker and ``omlx serve``) describes the process and leaves the rest to one
:class:`WorkerRun`, a :class:`~werk_host.plugin.process.ManagedProcess` in a private run
directory. The contract:

* **Identity.** Each run has a random :attr:`~WorkerRun.generation` (an adapter puts it in its
  identity: it changes whenever the process is replaced) and a :attr:`~WorkerRun.port` free on
  127.0.0.1 when the run was made (a caller whose argv fixes another port sets it before start).
* **Run directory.** :meth:`~WorkerRun.start` first sweeps ``work_dir`` for directories of the
  same ``prefix`` that no live owner holds (:func:`~werk_host.plugin.process.reap_stale_run_dirs`:
  their recorded children are stopped, never a process that merely reused a pid, and the
  directories removed), then creates ``work_dir/<prefix><generation>/`` (0700) already holding
  its owner lock, so ``werk cache list`` shows it as active while the worker lives. It is the
  worker's working directory and holds its log and child record; it is removed when the worker
  stops (a crash of Werk leaves it to the next start's sweep or ``werk cache purge``).
* **Secrets.** With ``key_env``, a random :attr:`~WorkerRun.key` reaches the worker in that
  environment variable only (an inherited value of it is dropped), never on the argv, which
  every local user can read; it is redacted from every log tail.
* **Environment.** ``env`` (default: this process's environment) with ``HF_HUB_OFFLINE=1``: a
  local checkpoint is served from its directory, nothing is downloaded.
* **Readiness.** :meth:`~WorkerRun.start` returns once ``GET ready_path`` answers 200 on the
  port. When the worker exits first, ``startup_timeout`` passes or anything else fails, the
  worker is stopped, its run directory removed and the error raised: a startup failure as
  ``error_type`` (a :class:`~werk_host.plugin.process.BackendStartupError`) with the redacted log
  tail and exit status.
* **Guard.** The worker dies with Werk whatever ends it; ``guard="group"`` (the process-group
  guard, :mod:`werk_host.plugin.process`) extends that to every process the worker starts.
* **Stop.** :meth:`~WorkerRun.stop` stops the worker's process group (SIGTERM, SIGKILL after
  ``stop_timeout``) and releases its run directory. Idempotent, also for a run never started.

A :class:`WorkerRun` starts once; a replaced worker is a new run (a new generation).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from werk_host.backends.child import Guard, create_run_dir
from werk_host.backends.managed import BackendProcessError, BackendStartupError, ManagedProcess, free_port, http_ready
from werk_host.backends.records import reap_stale_run_dirs
from werk_host.paths import ensure_private_dir

__all__ = ["LOOPBACK", "OFFLINE_ENV", "WorkerRun", "worker_env"]

LOOPBACK = "127.0.0.1"
#: Set in every worker's environment (module docstring, "Environment").
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1"}

Argv = Sequence[str] | Callable[[Path], Sequence[str]]
"""A worker's command line, or a function of its run directory that returns it (and may
prepare files there first)."""


def worker_env(base: Mapping[str, str], key_env: str | None = None, key: str | None = None) -> dict[str, str]:
    """``base`` with :data:`OFFLINE_ENV` and, with ``key_env``, the worker's own ``key`` in it
    (whatever ``base`` held under that name is dropped)."""
    env = {k: v for k, v in base.items() if k != key_env}
    env.update(OFFLINE_ENV)
    if key_env is not None and key is not None:
        env[key_env] = key
    return env


class WorkerRun:
    """One generation of a Werk-started engine worker (see the module docstring)."""

    def __init__(
        self,
        name: str,
        work_dir: Path,
        *,
        prefix: str,
        error_type: type[BackendStartupError] = BackendStartupError,
        stop_timeout: float = 10.0,
        key_env: str | None = None,
        host: str = LOOPBACK,
    ) -> None:
        """Configure the run (nothing starts). ``name`` labels logs and errors; ``prefix`` names
        this kind of worker's run directories under ``work_dir``."""
        self.name = name
        self.work_dir = work_dir
        self.prefix = prefix
        self.error_type = error_type
        self.stop_timeout = stop_timeout
        self.key_env = key_env
        self.host = host
        self.generation = secrets.token_hex(16)
        self.key = secrets.token_urlsafe(32) if key_env is not None else None
        self.port = free_port(host)
        self.argv: list[str] = []
        self.run_dir: Path | None = None
        self.managed: ManagedProcess | None = None
        self._stopped = False

    @property
    def pid(self) -> int | None:
        """The worker's pid, the id of its process group (the guard's, under a guard wrapper)."""
        return self.managed.pid if self.managed is not None else None

    def alive(self) -> bool:
        return self.managed is not None and self.managed.alive()

    def start(
        self,
        argv: Argv,
        *,
        log_name: str,
        startup_timeout: float,
        env: Mapping[str, str] | None = None,
        ready_path: str = "/health",
        guard: Guard | None = None,
    ) -> Path:
        """Start the worker and wait until it is ready (module docstring); returns its run
        directory. Raises ``error_type`` when it does not become ready, and whatever else failed
        (:class:`OSError`, :class:`~werk_host.plugin.PrivateDirError`) with nothing left behind."""
        if self.managed is not None or self._stopped:
            raise BackendProcessError(f"{self.name} run {self.generation[:8]} was already started")
        work = ensure_private_dir(self.work_dir)
        reap_stale_run_dirs(work, prefix=self.prefix, grace=self.stop_timeout)
        run_dir, owner_fd = create_run_dir(work, f"{self.prefix}{self.generation}")
        try:
            self.argv = [str(arg) for arg in (argv(run_dir) if callable(argv) else argv)]
            managed = ManagedProcess(
                self.argv,
                log_path=run_dir / log_name,
                name=self.name,
                env=worker_env(os.environ if env is None else env, self.key_env, self.key),
                cwd=run_dir,
                record_dir=run_dir,
                secrets=(self.key,) if self.key is not None else (),
                stop_timeout=self.stop_timeout,
                cleanup_dir=run_dir,
                owner_fd=owner_fd,
                error_type=self.error_type,
                guard=guard,
            )
        except BaseException:
            shutil.rmtree(run_dir, ignore_errors=True)
            with contextlib.suppress(OSError):
                os.close(owner_fd)
            raise
        self.run_dir = run_dir
        self.managed = managed
        managed.start()
        managed.wait_ready(http_ready(self.host, self.port, ready_path), timeout=startup_timeout)
        return run_dir

    def log_tail(self) -> str:
        """The redacted end of the worker's log (``""`` before it starts or after it stopped)."""
        return self.managed.log_tail() if self.managed is not None else ""

    def stop(self) -> None:
        self._stopped = True
        if self.managed is not None:
            self.managed.stop()

    def __repr__(self) -> str:
        return f"<WorkerRun {self.name} generation={self.generation[:8]} pid={self.pid} port={self.port}>"

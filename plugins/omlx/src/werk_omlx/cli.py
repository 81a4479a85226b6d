"""The oMLX CLI path (macOS on Apple silicon only): an installed ``omlx serve`` started on demand.

Where the ``omlx`` command is installed on Apple silicon (the ``omlx.executable`` backend option,
``WERK_OMLX``, else ``PATH``), Werk starts ``omlx serve`` on first use and reuses that exact
child for the model while the adapter lives: the model directory is linked alone into a private
model directory (``WERK_HOME/backends/omlx/cli/c-<generation>/models/<name>``) so the server
offers exactly that model, bound to 127.0.0.1 on a free port; readiness is ``GET /health``.
Native oMLX caches stay the backend's own: this path reports no expert control and no named
state. It cannot run on other platforms, and its tests are skipped there with that reason.
"""

from __future__ import annotations

import logging
import os
import secrets
from pathlib import Path

from werk_host.backends.child import create_run_dir, reap_stale_run_dirs
from werk_host.backends.managed import BackendStartupError, ManagedProcess, find_executable, free_port, http_ready
from werk_host.backends.relay import ConnectionPool
from werk_host.paths import ensure_private_dir

from .runtime import apple_silicon

log = logging.getLogger(__name__)

ENV_EXECUTABLE = "WERK_OMLX"
HOST = "127.0.0.1"
RUN_DIR_PREFIX = "c-"
STOP_TIMEOUT_S = 15.0


class OmlxCliStartupError(BackendStartupError):
    """``omlx serve`` did not become healthy; ``log_tail`` is the end of its log."""


def find_omlx(explicit: str | None) -> Path | None:
    """The ``omlx`` executable on Apple silicon, else ``None`` (the MLX worker serves instead)."""
    if not apple_silicon():
        return None
    return find_executable("omlx", explicit=explicit, env_var=ENV_EXECUTABLE, error=FileNotFoundError)


class OmlxCliServer:
    """One started ``omlx serve`` for one model (see the module docstring)."""

    def __init__(self, executable: Path, model_dir: Path, model_name: str, work_dir: Path, timeout: float) -> None:
        self.executable = executable
        self.model_dir = model_dir
        self.model_name = model_name
        self.work_dir = work_dir
        self.timeout = timeout
        self.generation = secrets.token_hex(12)
        self.port = free_port(HOST)
        self.pool = ConnectionPool(HOST, self.port, label="oMLX", size=8)
        self.managed: ManagedProcess | None = None

    @property
    def pid(self) -> int | None:
        return self.managed.pid if self.managed is not None else None

    def alive(self) -> bool:
        return self.managed is not None and self.managed.alive()

    def start(self) -> OmlxCliServer:
        work = ensure_private_dir(self.work_dir)
        reap_stale_run_dirs(work, prefix=RUN_DIR_PREFIX, grace=STOP_TIMEOUT_S)
        run_dir, owner_fd = create_run_dir(work, f"{RUN_DIR_PREFIX}{self.generation}")
        models = run_dir / "models"
        models.mkdir(mode=0o700)
        os.symlink(self.model_dir, models / self.model_name, target_is_directory=True)
        argv = [str(self.executable), "serve", "--model-dir", str(models), "--host", HOST, "--port", str(self.port)]
        self.managed = ManagedProcess(
            argv,
            log_path=run_dir / "omlx.log",
            name="oMLX",
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
            cwd=run_dir,
            record_dir=run_dir,
            stop_timeout=STOP_TIMEOUT_S,
            cleanup_dir=run_dir,
            owner_fd=owner_fd,
            error_type=OmlxCliStartupError,
        )
        self.managed.start()
        self.managed.wait_ready(http_ready(HOST, self.port, "/health"), timeout=self.timeout)
        log.info("omlx serve %s ready (pid %s, port %s)", self.generation[:8], self.pid, self.port)
        return self

    def stop(self) -> None:
        self.pool.close()
        if self.managed is not None:
            self.managed.stop()

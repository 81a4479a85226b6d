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
from pathlib import Path

from werk_host.plugin.http import ConnectionPool
from werk_host.plugin.process import BackendStartupError, find_executable
from werk_host.plugin.workers import WorkerRun

from .interpreter import apple_silicon

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
        self.timeout = timeout
        self.run = WorkerRun(
            "oMLX",
            work_dir,
            prefix=RUN_DIR_PREFIX,
            error_type=OmlxCliStartupError,
            stop_timeout=STOP_TIMEOUT_S,
            host=HOST,
        )
        self.generation = self.run.generation
        self.port = self.run.port
        self.pool = ConnectionPool(HOST, self.port, label="oMLX", size=8)

    @property
    def pid(self) -> int | None:
        return self.run.pid

    def alive(self) -> bool:
        return self.run.alive()

    def argv(self, run_dir: Path) -> list[str]:
        """``omlx serve`` over a model directory holding this model alone (linked in ``run_dir``)."""
        models = run_dir / "models"
        models.mkdir(mode=0o700)
        os.symlink(self.model_dir, models / self.model_name, target_is_directory=True)
        return [str(self.executable), "serve", "--model-dir", str(models), "--host", HOST, "--port", str(self.port)]

    def start(self) -> OmlxCliServer:
        self.run.start(self.argv, log_name="omlx.log", startup_timeout=self.timeout)
        log.info("omlx serve %s ready (pid %s, port %s)", self.generation[:8], self.pid, self.port)
        return self

    def stop(self) -> None:
        self.pool.close()
        self.run.stop()

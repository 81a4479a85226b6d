"""Werk-owned MLX worker processes, as the adapter in ``werk serve`` sees them.

A :class:`WorkerProcess` is one ``python -m werk_omlx.worker`` generation for one model and one
expert-cache budget: a :class:`~werk_host.plugin.workers.WorkerRun` (its own process group, dies
with ``werk serve``) in the private run directory ``WERK_HOME/backends/omlx/workers/w-<generation>/``.
That directory holds the worker's log, its child record and, with the prefix cache on,
``cache/prefix-cache/``; its owner lock is held while the worker lives, so ``werk cache list``
shows it as active, and it is removed when the worker stops (a crash leaves it for ``werk cache
purge`` or the next start's stale-directory sweep). The worker gets a random key in its
environment (never on the argv) and ``HF_HUB_OFFLINE=1``; startup waits for ``GET /health`` and
then reads ``/werk/status``, whose ``offload.active`` is the worker's own confirmation that
expert offload runs.
"""

from __future__ import annotations

import http.client
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from werk_host.plugin import ErrorCode, ExpertPolicy, WerkError
from werk_host.plugin.http import ConnectionPool
from werk_host.plugin.process import BackendStartupError
from werk_host.plugin.workers import WorkerRun

from .interpreter import MlxInterpreter

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
ENV_KEY = "WERK_OMLX_WORKER_KEY"
RUN_DIR_PREFIX = "w-"
LABEL = "the MLX worker"
CONTROL_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 10.0
#: Worker answers mapped to typed errors (the worker's own text stays in the log).
_ERRORS = {
    400: (ErrorCode.INVALID_REQUEST, "the MLX worker refused the request as invalid"),
    404: (ErrorCode.NOT_FOUND, "no such expert"),
    409: (ErrorCode.CONFLICT, "a pinned expert cannot be evicted; unpin it first"),
    429: (ErrorCode.RESOURCE_EXHAUSTED, "the experts do not fit the expert cache budget beside the pinned ones"),
    501: (ErrorCode.UNSUPPORTED, "expert offload is not active in this worker"),
}


class WorkerStartupError(BackendStartupError):
    """The worker did not become healthy; ``log_tail`` is the end of its log."""


@dataclass(frozen=True)
class WorkerSpec:
    """Everything that decides what a worker serves and how it starts."""

    mlx: MlxInterpreter
    model_dir: Path
    model_name: str
    #: the expert cache budget, or ``None`` for no offload
    budget_bytes: int | None
    prefix_cache: bool
    work_dir: Path
    startup_timeout: float


class WorkerProcess:
    """One started worker generation (see the module docstring)."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.run = WorkerRun(
            "MLX worker",
            spec.work_dir,
            prefix=RUN_DIR_PREFIX,
            error_type=WorkerStartupError,
            stop_timeout=STOP_TIMEOUT_S,
            key_env=ENV_KEY,
            host=HOST,
        )
        self.generation = self.run.generation
        self.port = self.run.port
        self._key = self.run.key or ""
        self.pool = ConnectionPool(HOST, self.port, api_key=self._key, label=LABEL, size=8)
        self.policy = ExpertPolicy()
        self.offload_active = False
        self.offload_reason: str | None = None
        self.last_used = time.monotonic()

    @property
    def pid(self) -> int | None:
        return self.run.pid

    def alive(self) -> bool:
        return self.run.alive()

    def touch(self) -> None:
        self.last_used = time.monotonic()

    def argv(self, run_dir: Path) -> list[str]:
        spec = self.spec
        argv = [str(spec.mlx.python), "-m", "werk_omlx.worker"]
        argv += ["--model-dir", str(spec.model_dir), "--model-name", spec.model_name, "--port", str(self.port)]
        if spec.budget_bytes is not None:
            argv += ["--expert-cache-bytes", str(spec.budget_bytes)]
        if spec.prefix_cache:
            argv += ["--prefix-cache-dir", str(run_dir / "cache" / "prefix-cache")]
        return argv

    def start(self) -> WorkerProcess:
        """Spawn, wait for ``/health`` and read the offload confirmation; a failure stops the
        child and raises :class:`WorkerStartupError`."""
        self.run.start(self.argv, log_name="worker.log", startup_timeout=self.spec.startup_timeout)
        try:
            status = self.status()
        except BaseException:
            self.stop()
            raise
        offload = status.get("offload") if isinstance(status.get("offload"), dict) else {}
        assert isinstance(offload, dict)
        self.offload_active = offload.get("active") is True
        reason = offload.get("reason")
        self.offload_reason = str(reason) if isinstance(reason, str) else None
        log.info(
            "MLX worker %s ready (pid %s, port %s, offload %s)",
            self.generation[:8],
            self.pid,
            self.port,
            "active" if self.offload_active else (self.offload_reason or "off"),
        )
        return self

    def stop(self) -> None:
        self.pool.close()
        self.run.stop()

    # -- control requests -------------------------------------------------------------------
    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """A control request on a fresh connection; a non-200 answer is a typed :class:`WerkError`."""
        conn = http.client.HTTPConnection(HOST, self.port, timeout=CONTROL_TIMEOUT_S)
        headers = {"Authorization": f"Bearer {self._key}", "Content-Type": "application/json"}
        try:
            conn.request(method, path, body=json.dumps(body).encode() if body is not None else None, headers=headers)
            response = conn.getresponse()
            raw = response.read()
        except (OSError, http.client.HTTPException) as err:
            raise WerkError(ErrorCode.UNAVAILABLE, f"{LABEL} is not answering", retryable=True) from err
        finally:
            conn.close()
        if response.status != 200:
            log.info("MLX worker %s %s answered %s: %.300r", method, path, response.status, raw)
            code, message = _ERRORS.get(response.status, (ErrorCode.UNAVAILABLE, f"{LABEL} failed the request"))
            raise WerkError(code, message, retryable=code is ErrorCode.UNAVAILABLE)
        try:
            data = json.loads(raw)
        except ValueError:
            data = None
        if not isinstance(data, dict):
            raise WerkError(ErrorCode.UNAVAILABLE, f"{LABEL} answered something other than JSON", retryable=True)
        return data

    def status(self) -> dict[str, Any]:
        return self.request("GET", "/werk/status")

    def __repr__(self) -> str:
        return f"<WorkerProcess generation={self.generation[:8]} pid={self.pid} budget={self.spec.budget_bytes}>"

"""Where a vLLM adapter's server answers: a Werk-started local process or a remote endpoint
(see :mod:`werk_vllm.adapter`).

* :class:`LocalTarget`: a registered Hugging Face model directory served by a Werk-started
  ``vllm serve`` (:mod:`werk_vllm.server`), shared by every adapter with the same launch key,
  restarted as a new generation after it died, released (stopped with the last holder) on close.
* :class:`RemoteTarget`: an ``endpoint`` some other machine runs. Nothing is launched; health is
  ``GET /health`` (else ``GET /v1/models``), cached for :data:`REACHABLE_TTL_S`.

Both answer :meth:`live` (the server answering now, or ``None``; never starts one) and
:meth:`connect` (the server to send a request to, starting a local one when none runs).
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from werk_host.plugin import EndpointKind, ErrorCode, PrivateDirError, WerkError

from . import server as servers
from .client import Endpoint, VllmPool, get
from .launch import RemoteSettings
from .server import LaunchSpec, SharedServer, VllmStartupError

__all__ = ["Live", "LocalTarget", "RemoteTarget", "Target", "served_max_model_len", "served_names"]

log = logging.getLogger(__name__)

REACHABLE_TTL_S = 2.0
REACHABLE_TIMEOUT_S = 2.0


def _unavailable(message: str, *, retryable: bool = True) -> WerkError:
    return WerkError(ErrorCode.UNAVAILABLE, message, retryable=retryable)


def served_max_model_len(models: dict[str, Any] | None, served_name: str) -> int | None:
    """``max_model_len`` of ``served_name`` in a ``/v1/models`` answer (vLLM's own field)."""
    if models is None or not isinstance(models.get("data"), list):
        return None
    for entry in models["data"]:
        if isinstance(entry, dict) and entry.get("id") == served_name:
            value = entry.get("max_model_len")
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


def served_names(models: dict[str, Any] | None) -> list[str]:
    if models is None or not isinstance(models.get("data"), list):
        return []
    return [str(e["id"]) for e in models["data"] if isinstance(e, dict) and "id" in e]


@dataclass(frozen=True)
class Live:
    """A server answering now: how to reach it and what Werk knows of it."""

    pool: VllmPool
    #: the effective argv of a Werk-started process; ``None`` for a remote endpoint
    argv: tuple[str, ...] | None
    pid: int | None
    generation: str


class LocalTarget:
    """A Werk-started ``vllm serve`` for a local model directory (shared; see the module docstring)."""

    kind = EndpointKind.LOCAL

    def __init__(self, server: SharedServer, model_dir: Path) -> None:
        self.server = server
        self.model_dir = model_dir
        self._closed = False

    @property
    def spec(self) -> LaunchSpec:
        return self.server.spec

    def live(self) -> Live | None:
        proc = self.server.current()
        if proc is None:
            return None
        return Live(proc.pool, tuple(proc.argv), proc.pid, proc.generation)

    def connect(self) -> Live:
        """The running server, starting one (a new generation) when none runs."""
        if self._closed:
            raise _unavailable("the vLLM adapter is shut down", retryable=False)
        try:
            proc = self.server.ensure()
        except VllmStartupError as err:
            log.error("vllm serve failed to start: %s\n--- vllm log (tail) ---\n%s", err.reason, err.log_tail)
            if err.returncode is not None:
                why = f"exited with status {err.returncode} during startup"
            elif "did not" in err.reason:
                why = f"did not become healthy within {self.spec.startup_timeout:g}s"
            else:
                why = "could not be executed"
            raise _unavailable(f"vLLM {why}; the server log has its log tail", retryable=False) from err
        except (OSError, PrivateDirError, RuntimeError) as err:
            log.error("vllm serve could not be started: %s", err)
            raise _unavailable("vLLM could not be started; the server log has the details", retryable=False) from err
        return Live(proc.pool, tuple(proc.argv), proc.pid, proc.generation)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            servers.release(self.server)


class RemoteTarget:
    """A vLLM endpoint running elsewhere (nothing is launched)."""

    kind = EndpointKind.REMOTE

    def __init__(self, settings: RemoteSettings, api_key: str | None) -> None:
        self.endpoint = Endpoint.parse(settings.endpoint)
        self.pool = VllmPool(self.endpoint, api_key=api_key, timeout=settings.request_timeout)
        self.generation = "remote-" + secrets.token_hex(8)
        self._checked_at = -1e9
        self._reachable = False
        self._probe_lock = threading.Lock()

    def probe(self) -> bool:
        """``GET /health`` answers 200; where the endpoint does not expose it (404, 405: e.g. a
        proxy passing only ``/v1``), ``GET /v1/models`` answers 200 (uncached)."""
        health = get(self.pool, "/health", timeout=REACHABLE_TIMEOUT_S)
        if health is None or health[0] not in (404, 405):
            return health is not None and health[0] == 200
        models = get(self.pool, "/v1/models", timeout=REACHABLE_TIMEOUT_S)
        return models is not None and models[0] == 200

    def reachable(self) -> bool:
        """:meth:`probe`, cached for :data:`REACHABLE_TTL_S` (discovery asks on every request)."""
        with self._probe_lock:
            if time.monotonic() - self._checked_at >= REACHABLE_TTL_S:
                self._reachable = self.probe()
                self._checked_at = time.monotonic()
            return self._reachable

    def live(self) -> Live | None:
        return Live(self.pool, None, None, self.generation) if self.reachable() else None

    def connect(self) -> Live:
        # A request to an endpoint that stopped answering fails in the relay (unavailable).
        return Live(self.pool, None, None, self.generation)

    def close(self) -> None:
        self.pool.close()


Target = LocalTarget | RemoteTarget

"""Werk-started ``vllm serve`` processes, shared by every adapter that would start the same one.

:class:`VllmProcess` is one process generation: a :class:`~werk_host.plugin.workers.WorkerRun`
(its run directory ``WERK_HOME/backends/vllm/gen-<generation>/`` holds its log and child record
and is removed when it stops) started under the process-group guard (``guard="group"``,
:mod:`werk_host.plugin.process`): vLLM's engine core and workers are children of its API
server, and the guard kills that whole group if Werk dies by any means; :attr:`pid` is that
group's id. The environment is the caller's plus ``HF_HUB_OFFLINE=1`` (a local model is served
from its directory; nothing is downloaded), ``VLLM_NO_USAGE_STATS=1`` and ``VLLM_API_KEY``: a
random key made for this process alone, so other local users cannot drive it. The key travels
in the environment, never on the argv (which every user can read), and is redacted from every
log tail. Startup waits for ``GET /health`` == 200 (``startup_timeout``); a failure stops the
child and raises :class:`VllmStartupError` with the redacted log tail.

:class:`SharedServer` is what adapters hold: one per :class:`LaunchSpec` key — the manifest
identity, the executable identity and the exact argument list (the port aside) — reference
counted by :func:`acquire`/:func:`release`. The first use starts the process; a process that
died (e.g. SIGKILL) is replaced by a new generation on the next use; the last release stops it.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

from werk_host.plugin.process import BackendStartupError
from werk_host.plugin.workers import WorkerRun

from .client import Endpoint, VllmPool
from .executable import ExecutableIdentity
from .launch import HOST, PORT, last_value

__all__ = [
    "ENV_API_KEY",
    "LaunchSpec",
    "SharedServer",
    "VllmProcess",
    "VllmStartupError",
    "acquire",
    "release",
    "shared_servers",
]

log = logging.getLogger(__name__)

NAME = "vllm"
ENV_API_KEY = "VLLM_API_KEY"
RUN_DIR_PREFIX = "gen-"
#: Set in the child's environment beside the host's offline hub and the key (module docstring).
CHILD_ENV = {"VLLM_NO_USAGE_STATS": "1"}
STOP_TIMEOUT_S = 20.0


class VllmStartupError(BackendStartupError):
    """``vllm serve`` did not become healthy; ``log_tail`` is the (redacted) end of its log."""


@dataclass(frozen=True)
class LaunchSpec:
    """Everything that decides which process serves: the sharing key and how to start it."""

    manifest_identity: str
    executable: ExecutableIdentity
    #: ``[executable, "serve", ...]`` with :data:`~werk_vllm.launch.PORT` standing for the port
    planned: tuple[str, ...]
    version: str = field(compare=False)
    work_dir: Path = field(compare=False)
    startup_timeout: float = field(compare=False)

    @property
    def key(self) -> tuple[str, ExecutableIdentity, tuple[str, ...]]:
        return (self.manifest_identity, self.executable, self.planned)

    def argv(self, port: int) -> list[str]:
        return [str(port) if arg == PORT else arg for arg in self.planned]


class VllmProcess:
    """One started ``vllm serve`` generation (see the module docstring)."""

    def __init__(self, spec: LaunchSpec) -> None:
        self.spec = spec
        self.run = WorkerRun(
            NAME,
            spec.work_dir,
            prefix=RUN_DIR_PREFIX,
            error_type=VllmStartupError,
            stop_timeout=STOP_TIMEOUT_S,
            key_env=ENV_API_KEY,
            host=HOST,
        )
        self.generation = self.run.generation
        self.argv = spec.argv(self.run.port)
        final = last_value(self.argv[1:], "--port")
        if final is not None and final.isdigit():
            self.run.port = int(final)
        self.port = self.run.port
        self.pool = VllmPool(Endpoint(False, HOST, self.port), api_key=self.run.key)

    @property
    def pid(self) -> int | None:
        return self.run.pid

    def alive(self) -> bool:
        return self.run.alive()

    def start(self) -> VllmProcess:
        """Spawn and wait for ``/health``; on any failure the child is stopped and
        :class:`VllmStartupError` raised (the log tail redacted)."""
        env = {**os.environ, **CHILD_ENV}
        self.run.start(
            self.argv, log_name="vllm.log", startup_timeout=self.spec.startup_timeout, env=env, guard="group"
        )
        log.info("vllm serve generation %s ready (pid %s, port %s)", self.generation[:8], self.pid, self.port)
        return self

    def stop(self) -> None:
        self.pool.close()
        self.run.stop()

    def __repr__(self) -> str:
        return f"<VllmProcess generation={self.generation[:8]} pid={self.pid} port={self.port}>"


class SharedServer:
    """The process of one launch key, shared by the adapters holding it (module docstring)."""

    def __init__(self, spec: LaunchSpec) -> None:
        self.spec = spec
        self.refs = 0
        self.starts = 0
        self.closed = False
        self._process: VllmProcess | None = None
        self._lock = threading.RLock()

    def current(self) -> VllmProcess | None:
        """The running process, or ``None`` (never starts one)."""
        proc = self._process
        return proc if proc is not None and proc.alive() else None

    def ensure(self) -> VllmProcess:
        """The running process, starting a new generation when there is none (one start at a time)."""
        with self._lock:
            if self.closed:
                raise RuntimeError("the vLLM server was released by every adapter")
            proc = self._process
            if proc is not None and proc.alive():
                return proc
            if proc is not None:
                log.warning("vllm serve generation %s is gone; starting a new one", proc.generation[:8])
                proc.stop()
                self._process = None
            fresh = VllmProcess(self.spec)
            self.starts += 1
            fresh.start()
            self._process = fresh
            return fresh

    def stop(self) -> None:
        with self._lock:
            self.closed = True
            proc, self._process = self._process, None
        if proc is not None:
            proc.stop()


_SERVERS: dict[tuple[str, ExecutableIdentity, tuple[str, ...]], SharedServer] = {}
_SERVERS_LOCK = threading.Lock()


def acquire(spec: LaunchSpec) -> SharedServer:
    """The shared server of ``spec``'s key, with one more reference (nothing starts here)."""
    with _SERVERS_LOCK:
        server = _SERVERS.get(spec.key)
        if server is None:
            server = SharedServer(spec)
            _SERVERS[spec.key] = server
        server.refs += 1
        return server


def release(server: SharedServer) -> None:
    """Drop one reference; the last one stops the process."""
    with _SERVERS_LOCK:
        server.refs -= 1
        last = server.refs <= 0
        if last and _SERVERS.get(server.spec.key) is server:
            del _SERVERS[server.spec.key]
    if last:
        server.stop()


def shared_servers() -> list[SharedServer]:
    """The shared servers some adapter holds now (for tests and diagnostics)."""
    with _SERVERS_LOCK:
        return list(_SERVERS.values())

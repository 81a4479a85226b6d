"""Werk-started ``vllm serve`` processes, shared by every adapter that would start the same one.

:class:`VllmProcess` is one process generation: a
:class:`~werk_host.backends.managed.ManagedProcess` (its own process group, dies with
``werk serve``, stopped with its group, never orphaned) in a private run directory
``WERK_HOME/backends/vllm/gen-<generation>/`` that holds its log and child record and is removed
when it stops. The managed child is a small guard (:mod:`werk_vllm._guard`) that runs
``vllm serve`` in its process group and kills that whole group if Werk dies, since vLLM's engine
core and workers are grandchildren a parent-death signal alone would not reach; :attr:`pid` is
that group's id. The environment is the caller's plus ``HF_HUB_OFFLINE=1`` (a local model is
served from its directory; nothing is downloaded), ``VLLM_NO_USAGE_STATS=1`` and
``VLLM_API_KEY``: a random key made for this process alone, so other local users cannot drive
it. The key travels in the environment, never on the argv (which every user can read), and is
redacted from every log tail. Startup waits for ``GET /health`` == 200 (``startup_timeout``);
a failure stops the child and raises :class:`VllmStartupError` with the redacted log tail.

:class:`SharedServer` is what adapters hold: one per :class:`LaunchSpec` key — the manifest
identity, the executable identity and the exact argument list (the port aside) — reference
counted by :func:`acquire`/:func:`release`. The first use starts the process; a process that
died (e.g. SIGKILL) is replaced by a new generation on the next use; the last release stops it.
"""

from __future__ import annotations

import logging
import os
import secrets
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from werk_host.backends.child import create_run_dir, reap_stale_run_dirs
from werk_host.backends.managed import BackendStartupError, ManagedProcess, free_port, http_ready
from werk_host.paths import ensure_private_dir

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
#: Runs ``vllm serve`` so that its whole process group dies with Werk (see :mod:`werk_vllm._guard`).
GUARD = Path(__file__).with_name("_guard.py")
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


def child_env(base: Mapping[str, str], api_key: str) -> dict[str, str]:
    """The child's environment: ``base`` with its own API key and offline Hugging Face hub."""
    env = {k: v for k, v in base.items() if k != ENV_API_KEY}
    env["HF_HUB_OFFLINE"] = "1"
    env["VLLM_NO_USAGE_STATS"] = "1"
    env[ENV_API_KEY] = api_key
    return env


class VllmProcess:
    """One started ``vllm serve`` generation (see the module docstring)."""

    def __init__(self, spec: LaunchSpec) -> None:
        self.spec = spec
        self.generation = secrets.token_hex(16)
        self._api_key = secrets.token_urlsafe(32)
        port = free_port(HOST)
        self.argv = spec.argv(port)
        final = last_value(self.argv[1:], "--port")
        self.port = int(final) if final is not None and final.isdigit() else port
        self.managed: ManagedProcess | None = None
        self.pool = VllmPool(Endpoint(False, HOST, self.port), api_key=self._api_key)

    @property
    def pid(self) -> int | None:
        return self.managed.pid if self.managed is not None else None

    def alive(self) -> bool:
        return self.managed is not None and self.managed.alive()

    def start(self) -> VllmProcess:
        """Spawn and wait for ``/health``; on any failure the child is stopped and
        :class:`VllmStartupError` raised (the log tail redacted)."""
        work = ensure_private_dir(self.spec.work_dir)
        reap_stale_run_dirs(work, prefix=RUN_DIR_PREFIX, grace=STOP_TIMEOUT_S)
        run_dir, owner_fd = create_run_dir(work, f"{RUN_DIR_PREFIX}{self.generation}")
        guarded = [sys.executable, "-I", "-S", str(GUARD), str(os.getpid()), *self.argv]
        self.managed = ManagedProcess(
            guarded,
            log_path=run_dir / "vllm.log",
            name=NAME,
            env=child_env(os.environ, self._api_key),
            cwd=run_dir,
            record_dir=run_dir,
            secrets=(self._api_key,),
            stop_timeout=STOP_TIMEOUT_S,
            cleanup_dir=run_dir,
            owner_fd=owner_fd,
            error_type=VllmStartupError,
        )
        self.managed.start()
        ready = http_ready(HOST, self.port, "/health")
        self.managed.wait_ready(ready, timeout=self.spec.startup_timeout)
        log.info("vllm serve generation %s ready (pid %s, port %s)", self.generation[:8], self.pid, self.port)
        return self

    def stop(self) -> None:
        self.pool.close()
        if self.managed is not None:
            self.managed.stop()

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

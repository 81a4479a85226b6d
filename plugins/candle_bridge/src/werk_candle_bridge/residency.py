"""Loaded models: one per exact manifest identity and engine settings, lazy, shared, unloaded.

The seed's execution matrix (docs/candle.md, "Residency"): the in-process engine lives for the
``werk serve`` process, and loaded weights are keyed by the exact, checksum-sensitive manifest
identity. Here:

* :class:`ModelPool` hands out one :class:`SharedModel` per ``(manifest identity, engine
  settings)``; every adapter for that key holds a reference (two instances of one model share
  the weights).
* Nothing is loaded until a request needs the engine (:meth:`SharedModel.engine`); concurrent
  first requests wait for one load. Before loading, the file is checked against the manifest's
  size and SHA-256: a file changed since ``werk models add`` is refused, never served under the
  old identity.
* When the last reference is released (instance stop, ``keep_alive``, host shutdown) the engine
  is closed: the Runner is dropped and freed memory is handed back (``malloc_trim``).
* A failed load is remembered with its public reason; the next use tries again.

Request accounting for observability (requests waiting for their first token or generating,
prefix-cache hits) lives here too, since every adapter of one model shares it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from werk_host.plugin import ErrorCode, ModelManifest, WerkError, ensure_private_dir, sha256_file

from .engine import Engine, EngineFailure, EngineSettings, load_engine, missing_engine_reason
from .gguf import GgufError, GgufMetadata, read_metadata
from .prefix import PrefixEvidence, probe_prefix_cache
from .template import PromptRenderer, engine_template

__all__ = ["POOL", "ModelPool", "SharedModel", "Ticket"]

log = logging.getLogger(__name__)


def _unavailable(message: str, *, retryable: bool = False) -> WerkError:
    return WerkError(ErrorCode.UNAVAILABLE, message, retryable=retryable)


@dataclass
class _Traffic:
    waiting: int = 0
    generating: int = 0


class SharedModel:
    """One model as the engine holds it, shared by every adapter with the same key."""

    def __init__(self, manifest: ModelManifest, settings: EngineSettings, work_dir: Path) -> None:
        self.manifest = manifest
        self.settings = settings
        self.work_dir = work_dir
        self.prefix = PrefixEvidence(enabled=settings.prefix_cache_n > 0)
        self.refs = 0
        self.failure: str | None = None
        self._engine: Engine | None = None
        self._metadata: GgufMetadata | None = None
        self._renderer: PromptRenderer | None = None
        self._load_lock = threading.Lock()
        self._lock = threading.Lock()
        self._traffic = _Traffic()

    @property
    def name(self) -> str:
        return self.manifest.name

    # -- what is known without loading ---------------------------------------------------------
    def metadata(self) -> GgufMetadata:
        """The GGUF header values (read once). Raises ``unavailable`` for an unreadable file."""
        with self._lock:
            if self._metadata is not None:
                return self._metadata
        try:
            found = read_metadata(self.manifest.primary_path)
        except (GgufError, OSError) as err:
            log.error("candle: model %s has no readable GGUF header: %s", self.name, err)
            raise _unavailable(
                f"the candle engine cannot load model {self.name}: it is not a readable GGUF file"
            ) from err
        with self._lock:
            self._metadata = found
        return found

    def renderer(self) -> PromptRenderer:
        with self._lock:
            if self._renderer is not None:
                return self._renderer
        meta = self.metadata()
        made = PromptRenderer(
            meta.chat_template, bos_token=meta.bos_token, eos_token=meta.eos_token, unk_token=meta.unk_token
        )
        with self._lock:
            self._renderer = made
        return made

    def loaded(self) -> Engine | None:
        """The engine when the model is loaded now (never loads)."""
        with self._lock:
            return self._engine

    # -- loading ---------------------------------------------------------------------------------
    def engine(self) -> Engine:
        """The loaded engine, loading it first when needed (module docstring). Raises
        ``unavailable`` (not retryable) when the engine is missing or cannot load the model."""
        engine = self.loaded()
        if engine is not None:
            return engine
        with self._load_lock:
            engine = self.loaded()
            if engine is not None:
                return engine
            try:
                engine = self._load()
            except WerkError as err:
                with self._lock:
                    self.failure = err.message
                raise
            with self._lock:
                self._engine, self.failure = engine, None
            return engine

    def _verify(self) -> Path:
        path = self.manifest.primary_path
        recorded = self.manifest.files[0]
        try:
            same = path.stat().st_size == recorded.bytes and sha256_file(path) == recorded.sha256
        except OSError as err:
            raise _unavailable(f"the file of model {self.name} is gone; register it again") from err
        if not same:
            raise _unavailable(
                f"the file of model {self.name} changed since it was registered; register it again (werk models add)"
            )
        return path

    def _template_file(self, meta: GgufMetadata) -> Path:
        directory = ensure_private_dir(self.work_dir / "templates")
        target = directory / f"{self.manifest.identity[:32]}.jinja"
        staged = directory / f".{target.name}.{os.getpid()}.tmp"
        fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(engine_template(meta.chat_template))
        os.replace(staged, target)
        return target

    def _load(self) -> Engine:
        missing = missing_engine_reason()
        if missing is not None:
            raise _unavailable(missing)
        path = self._verify()
        meta = self.metadata()
        started = time.monotonic()
        try:
            engine = load_engine(path, self._template_file(meta), self.settings)
        except EngineFailure as err:
            log.error("candle: loading model %s failed: %s", self.name, err.detail)
            raise _unavailable(
                f"the candle engine could not load model {self.name}; the server log has the details"
            ) from err
        except OSError as err:
            log.error("candle: preparing model %s failed: %s", self.name, err)
            raise _unavailable(f"the candle engine could not prepare model {self.name}") from err
        log.info(
            "candle: loaded model %s in %.2fs (generation %s)", self.name, time.monotonic() - started, engine.generation
        )
        if self.prefix.enabled:
            probe_prefix_cache(engine, self.renderer(), self.prefix)
        return engine

    def unload(self) -> None:
        """Close the engine (weights freed, memory trimmed); the next use loads again."""
        with self._load_lock:
            with self._lock:
                engine, self._engine = self._engine, None
                self.prefix.reset()
            if engine is not None:
                engine.close()
                log.info("candle: unloaded model %s (generation %s)", self.name, engine.generation)

    # -- traffic -----------------------------------------------------------------------------------
    def ticket(self) -> Ticket:
        """Account one request in the engine, waiting until :meth:`Ticket.generating`."""
        return Ticket(self)

    def _count(self, waiting: int, generating: int) -> None:
        with self._lock:
            self._traffic.waiting += waiting
            self._traffic.generating += generating

    def traffic(self) -> tuple[int, int]:
        """``(generating, waiting)`` requests now: generating ones have had their first token;
        waiting ones are queued in the engine or in prefill."""
        with self._lock:
            return self._traffic.generating, self._traffic.waiting


class Ticket:
    """One request's place in :meth:`SharedModel.traffic` (idempotent transitions)."""

    def __init__(self, shared: SharedModel) -> None:
        self._shared = shared
        self._state = "waiting"
        shared._count(1, 0)

    def generating(self) -> None:
        if self._state == "waiting":
            self._state = "generating"
            self._shared._count(-1, 1)

    def done(self) -> None:
        if self._state == "waiting":
            self._shared._count(-1, 0)
        elif self._state == "generating":
            self._shared._count(0, -1)
        self._state = "done"


class ModelPool:
    """The process-wide table of :class:`SharedModel` (module docstring). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._models: dict[tuple[str, EngineSettings], SharedModel] = {}

    def acquire(self, manifest: ModelManifest, settings: EngineSettings, work_dir: Path) -> SharedModel:
        key = (manifest.identity, settings)
        with self._lock:
            shared = self._models.get(key)
            if shared is None:
                shared = self._models[key] = SharedModel(manifest, settings, work_dir)
            shared.refs += 1
            return shared

    def release(self, shared: SharedModel) -> None:
        """Drop one reference; the last one unloads the model."""
        with self._lock:
            shared.refs -= 1
            last = shared.refs <= 0
            if last:
                self._models.pop((shared.manifest.identity, shared.settings), None)
        if last:
            shared.unload()


#: The pool of this ``werk serve`` process.
POOL = ModelPool()

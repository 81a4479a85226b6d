"""Engines in a Werk-owned worker (docs/plugin-kit.md, "Engine workers"): the adapter side of a
backend whose engine runs in its own virtualenv, one serialized HTTP worker per exact model (or,
for a backend whose worker holds many models, one per host), at most a bounded number loaded at
once (the seed's Transformers and ONNX Runtime GenAI rows: "one serialized Werk-owned worker per
exact model ... bounded LRU"; its Diffusers row: "one serialized resident execution worker").

Two classes. :class:`EngineWorker` is the lifetime part every such backend shares: the worker's
key, start, identity, restart, close and its ``werk_workers`` observation. :class:`EngineAdapter`
(a subclass) adds the chat hooks of a chat engine. A plugin subclasses one of them with its
engine's parts only: the class attributes that name it (``backend``, ``label``, ``python_env``,
``key_env``, ``worker``, ``pool``, and ``per_model``) and, when its worker takes more than
``--kit``, ``--model`` and ``--port``, :meth:`EngineWorker.worker_args`.
Its ``worker.py`` runs the kit's worker side, :mod:`werk_host.plugin.engine_worker`, loaded by
the path :data:`WORKER_KIT` that the adapter passes as ``--kit``. The contract:

* **Identity.** ``instance_id`` is ``<backend>:<model>``; :meth:`~EngineWorker.identity` adds the
  live worker's generation (``not-loaded`` when none is alive), so it changes whenever the
  worker process is replaced.
* **One worker per exact model** (``per_model = True``, the default). The pool key is
  :func:`~werk_host.plugin.pool.files_identity` of the manifest, the engine interpreter and the
  ``runtime`` settings the plugin passes (everything that changes what runs). Adapters of the
  same key share one worker; the worker is stopped when the last of them closes
  (:class:`~werk_host.plugin.pool.WorkerPool`). With ``per_model = False`` the key is the
  interpreter and ``runtime`` only: every model of the backend shares ONE worker per host,
  which loads models itself when a request names one (the worker takes no ``--model``).
* **Start.** A worker is a :class:`~werk_host.plugin.workers.WorkerRun` under
  ``<home>/backends/<backend>/workers/worker-<generation>/``, with its key in ``key_env`` only,
  started as ``<python> <worker> --kit WORKER_KIT [--model DIR] --port P [worker_args]`` under the
  process-group guard; ``startup_timeout`` bounds its load. A worker that does not load is
  ``unavailable`` (retryable): "the <label> worker could not load the model".
* **Workers.** ``werk_workers`` observes the live worker: its pid (the memory manager accounts
  the process group by it), state ``running``, one slot; nothing while no worker is alive.
* **Capabilities from evidence** (:class:`EngineAdapter`). ``runtime.model_residency`` is
  ``supported`` while the worker is alive (its health route answers only once the model is
  loaded), ``unavailable`` otherwise (the next request loads it); ``api.chat.token_count`` and
  ``api.chat.admission`` exact (the worker's ``/count``: the model's tokenizer and chat
  template); ``api.chat.limits`` from the model's own context (``context``, the plugin reads it
  from its model directory), one request at a time; ``runtime.state.prefix_cache``
  ``unsupported``.
* **Chat limits.** The context as given; the output ceiling the manifest's ``max_output_tokens``
  param, else the context less one, never above the context less one;
  ``max_concurrent_requests`` 1.
* **Relays.** ``werk_count_tokens`` posts ``messages`` (and ``tools``) to ``/count``;
  ``werk_chat_completion`` relays the request (without ``werk``) to the worker's
  ``/v1/chat/completions`` while holding the worker's one seat (:meth:`~werk_host.plugin.pool.Slot.hold`)
  until the answer's body ends or is closed. A forced ``tool_choice`` (``"required"`` or a named
  function) is refused as ``invalid_request``: the engines cannot constrain their output, and a
  forced choice is made real or refused, never ignored (docs/plugin-kit.md, "Tool calls").

The settings helpers (:func:`model_cache_size`, :func:`engine_options`) and
:func:`engine_doctor_checks` read and check what every such backend has: the engine interpreter
(an option ``python`` or the environment), ``startup_timeout`` and the LRU's capacity.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
from collections.abc import Callable, Hashable, Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from pydantic import JsonValue

from werk_host import hookimpl
from werk_host.backends.managed import BackendStartupError
from werk_host.backends.relay import ConnectionPool, forward, post_json
from werk_host.config import HostConfig
from werk_host.errors import ErrorCode, WerkError
from werk_host.models import ModelManifest
from werk_host.plugin.pool import Slot, Started, WorkerPool, files_identity
from werk_host.plugin.workers import LOOPBACK, WorkerRun
from werk_host.protocol import CapabilityId, CapabilityStatus, ChatLimits, ChatRequest, WorkerObservation
from werk_host.seam import CapabilityReport, DoctorCheck, InferenceResponse, JsonObject

__all__ = [
    "REPORTED",
    "WORKER_KIT",
    "EngineAdapter",
    "EngineWorker",
    "engine_doctor_checks",
    "engine_options",
    "model_cache_size",
    "started",
    "torch_runtime",
]

#: The kit's worker side, passed to every worker as ``--kit`` (module docstring).
WORKER_KIT = Path(__file__).with_name("engine_worker.py")
#: The capabilities an :class:`EngineAdapter` reports on.
REPORTED = (
    CapabilityId.MODEL_RESIDENCY,
    CapabilityId.TOKEN_COUNT,
    CapabilityId.ADMISSION,
    CapabilityId.CHAT_LIMITS,
    CapabilityId.PREFIX_CACHE,
)
A = TypeVar("A", bound="EngineWorker")


def _forced_tool_choice(body: JsonObject) -> bool:
    choice = body.get("tool_choice")
    return choice == "required" or isinstance(choice, dict)


class EngineWorker:
    """The worker lifetime of one deployment instance served by its engine's worker (module
    docstring): key, start, identity, restart, close and the ``werk_workers`` observation."""

    backend: str
    #: How messages and logs name the engine: "the <label> worker".
    label: ClassVar[str]
    #: The environment variable naming the engine interpreter (for the error when it is unset).
    python_env: ClassVar[str]
    #: The environment variable that carries the worker's key.
    key_env: ClassVar[str]
    #: The plugin's ``worker.py``.
    worker: ClassVar[Path]
    pool: ClassVar[WorkerPool]
    #: One worker per exact model (``True``), or one per host for every model of the backend.
    per_model: ClassVar[bool] = True

    def __init__(
        self,
        config: HostConfig,
        manifest: ModelManifest,
        directory: Path,
        *,
        python: str | None,
        startup_timeout: float,
        runtime: tuple[Hashable, ...] = (),
    ) -> None:
        if python is None:
            raise WerkError(
                ErrorCode.UNAVAILABLE,
                f"the {self.backend} backend needs its engine interpreter: set {self.python_env} "
                f"(bash scripts/setup-engine-venv.sh {self.backend} prints it) or {self.backend}.python",
                retryable=False,
            )
        self.config = config
        self.manifest = manifest
        self.directory = directory
        self.python = python
        self.startup_timeout = startup_timeout
        self.instance_id = f"{self.backend}:{manifest.name}"
        model: tuple[Hashable, ...] = (files_identity(manifest),) if self.per_model else ()
        self.key: Hashable = (*model, python, *runtime)
        self.slot: Slot = self.pool.attach(self.key, id(self))
        self._closed = threading.Event()

    def worker_args(self) -> list[str]:
        """The worker's engine-specific arguments after ``--model`` and ``--port``."""
        return []

    # -- lifetime -----------------------------------------------------------------------------
    def identity(self) -> str:
        return f"{self.instance_id}#{self.slot.generation() or 'not-loaded'}"

    def load(self) -> None:
        """Make sure this model's worker is alive (started now when it is not)."""
        with self.pool.use(self.slot, self._start):
            pass

    def restart(self) -> None:
        """Replace the worker by a new process (a new generation)."""
        self.slot.stop()
        self.load()

    def close(self) -> None:
        if not self._closed.is_set():
            self._closed.set()
            self.pool.detach(self.key, id(self))

    def _start(self) -> Started:
        name = f"{self.label} worker ({self.manifest.name})" if self.per_model else f"{self.label} worker"
        run = WorkerRun(
            name,
            self.config.home / "backends" / self.backend / "workers",
            prefix="worker-",
            key_env=self.key_env,
        )
        argv = [self.python, str(self.worker), "--kit", str(WORKER_KIT)]
        if self.per_model:
            argv += ["--model", str(self.directory)]
        argv += ["--port", str(run.port), *self.worker_args()]
        try:
            run.start(argv, log_name="worker.log", startup_timeout=self.startup_timeout, guard="group")
        except BackendStartupError as err:
            raise WerkError(
                ErrorCode.UNAVAILABLE, f"the {self.label} worker could not load the model", retryable=True
            ) from err
        pool = ConnectionPool(
            LOOPBACK, run.port, api_key=run.key, label=f"{self.label} worker", bounds=self.config.backend_bounds
        )
        return Started(run, pool)

    @hookimpl(specname="werk_workers")
    def workers(self) -> list[WorkerObservation]:
        started = self.slot.started
        pid = started.run.pid if started is not None and started.run.alive() else None
        if pid is None:
            return []
        return [
            WorkerObservation(
                model=self.manifest.name,
                backend=self.backend,
                pid=pid,
                state="running",
                slots=1,
                context_per_request_tokens=None,
                context_capacity_tokens=None,
            )
        ]


class EngineAdapter(EngineWorker):
    """One deployment instance of a chat model served by its engine's worker (module docstring)."""

    def __init__(
        self,
        config: HostConfig,
        manifest: ModelManifest,
        directory: Path,
        *,
        python: str | None,
        startup_timeout: float,
        context: int | None,
        runtime: tuple[Hashable, ...] = (),
    ) -> None:
        super().__init__(config, manifest, directory, python=python, startup_timeout=startup_timeout, runtime=runtime)
        self.context = context

    # -- operation hooks (docs/plugin-hooks.md) --------------------------------------------------
    @hookimpl(specname="werk_capabilities")
    def capabilities(self) -> dict[CapabilityId, CapabilityReport]:
        residency = (
            CapabilityReport(CapabilityStatus.SUPPORTED, f"the model is loaded in its live {self.label} worker")
            if self.slot.alive()
            else CapabilityReport(
                CapabilityStatus.UNAVAILABLE, "no live worker holds the model; the next request loads it"
            )
        )
        exact = "exact: the model's tokenizer and chat template in its worker"
        return {
            CapabilityId.MODEL_RESIDENCY: residency,
            CapabilityId.TOKEN_COUNT: CapabilityReport(CapabilityStatus.SUPPORTED, exact),
            CapabilityId.ADMISSION: CapabilityReport(CapabilityStatus.SUPPORTED, "from the exact token count"),
            CapabilityId.CHAT_LIMITS: CapabilityReport(
                CapabilityStatus.SUPPORTED, "from config.json; one request at a time"
            ),
            CapabilityId.PREFIX_CACHE: CapabilityReport(
                CapabilityStatus.UNSUPPORTED, "only the running generation keeps a KV cache"
            ),
        }

    @hookimpl(specname="werk_chat_limits")
    def chat_limits(self, model: str | None) -> ChatLimits:
        ceiling = self.manifest.params.get("max_output_tokens")
        output = ceiling if isinstance(ceiling, int) and ceiling > 0 else None
        if output is None and self.context is not None:
            output = self.context - 1
        if output is not None and self.context is not None:
            output = min(output, self.context - 1)
        return ChatLimits(
            model=model or self.manifest.name,
            context_tokens=self.context,
            max_output_tokens=output,
            max_concurrent_requests=1,
        )

    @hookimpl(specname="werk_count_tokens")
    def count_tokens(self, request: ChatRequest) -> int:
        body = request.model_dump(mode="json", exclude_none=True)
        counted: JsonObject = {"messages": body["messages"]}
        if "tools" in body:
            counted["tools"] = body["tools"]
        with self.pool.use(self.slot, self._start) as started:
            answer = post_json(started.pool, "/count", counted)
        tokens = answer.get("prompt_tokens")
        if not isinstance(tokens, int):
            raise WerkError(ErrorCode.UNAVAILABLE, f"the {self.label} worker answered no count", retryable=True)
        return tokens

    @hookimpl(specname="werk_chat_completion")
    def chat_completion(self, request: JsonObject) -> InferenceResponse:
        body = {k: v for k, v in request.items() if k != "werk"}
        if _forced_tool_choice(body):
            raise WerkError(
                ErrorCode.INVALID_REQUEST,
                f"tool_choice cannot force a call on backend {self.backend} (it cannot constrain its output)",
            )
        use = self.pool.use(self.slot, self._start)
        started = use.__enter__()
        hold = self.slot.hold()
        try:
            hold.__enter__()
        except BaseException as err:
            use.__exit__(type(err), err, err.__traceback__)
            raise
        once = threading.Lock()

        def release() -> None:
            if once.acquire(blocking=False):
                hold.__exit__(None, None, None)
                use.__exit__(None, None, None)

        try:
            response = forward(started.pool, "/v1/chat/completions", body)
        except BaseException:
            release()
            raise

        def events() -> Iterator[bytes]:
            try:
                yield from response.body
            finally:
                release()

        def close() -> None:
            try:
                response.close()
            finally:
                release()

        return InferenceResponse(response.status, response.headers, events(), close)


def started(adapter: A) -> A:
    """``adapter`` with its worker loaded; closed again when the load fails."""
    try:
        adapter.load()
    except BaseException:
        adapter.close()
        raise
    return adapter


# -- settings ---------------------------------------------------------------------------------
def model_cache_size(name: str, env: Mapping[str, str] | None = None) -> int:
    """How many models the pool may hold loaded, from the environment variable ``name``: at least
    1, default 1 (the seed's bound); raises :class:`ValueError` naming it when it is not a
    positive integer."""
    raw = (os.environ if env is None else env).get(name, "").strip()
    if not raw:
        return 1
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{name} must be a positive integer")
    return int(raw)


#: A torch engine's ``device`` option (docs/plugin-kit.md, "Engine workers").
TORCH_DEVICE_RE = re.compile(r"auto|cpu|cuda(:\d{1,2})?")


def torch_runtime(options: Mapping[str, JsonValue]) -> tuple[str, int]:
    """A torch engine's ``(device, threads)`` options: ``device`` ``auto`` (CUDA when torch sees
    one, else CPU; the default), ``cpu``, ``cuda`` or ``cuda:N``; ``threads`` torch's CPU
    threads, 0 to 1024 (0, the default: torch's own). Raises :class:`ValueError` naming the
    option, never its value."""
    device = options.get("device", "auto")
    if not isinstance(device, str) or not TORCH_DEVICE_RE.fullmatch(device):
        raise ValueError("device must be auto, cpu, cuda or cuda:N")
    threads = options.get("threads", 0)
    if not isinstance(threads, int) or isinstance(threads, bool) or not 0 <= threads <= 1024:
        raise ValueError("threads must be an integer from 0 to 1024")
    return device, threads


def engine_options(
    options: Mapping[str, JsonValue],
    python_env: str,
    env: Mapping[str, str] | None = None,
    *,
    extra: tuple[str, ...] = (),
) -> tuple[str | None, float]:
    """The options every engine backend has, ``(python, startup_timeout)``: ``python`` (else the
    environment variable ``python_env``) and ``startup_timeout`` (seconds, 1 to 3600, default
    300). Names other than those and ``extra`` (the plugin's own, which it checks itself) raise
    :class:`ValueError` naming the option, never its value."""
    environ = os.environ if env is None else env
    known = ("python", *extra, "startup_timeout")
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(f"unknown option {unknown[0]} (known: {', '.join(known)})")
    python = options.get("python", environ.get(python_env) or None)
    if python is not None and (not isinstance(python, str) or not python):
        raise ValueError("python must be a path to the engine virtualenv's interpreter")
    timeout = options.get("startup_timeout", 300)
    if not isinstance(timeout, int | float) or isinstance(timeout, bool) or not 1 <= timeout <= 3600:
        raise ValueError("startup_timeout must be a number of seconds from 1 to 3600")
    return python, float(timeout)


def engine_doctor_checks(
    config: HostConfig,
    backend: str,
    *,
    parse: Callable[[Mapping[str, JsonValue]], Any],
    cache_size: Callable[[], int],
    cache_size_env: str,
    python_env: str,
    probe: str,
    missing: str,
) -> list[DoctorCheck]:
    """``werk doctor`` for an engine backend: its options (``parse`` returns an object with a
    ``python`` attribute), the model LRU's capacity, and the engine interpreter, asked to run
    ``probe`` (its output is the check's detail; a failure says ``missing``)."""
    fix = f"run `bash scripts/setup-engine-venv.sh {backend}` and set {python_env} to the path it prints"
    try:
        python: str | None = parse(config.backend_options.get(backend, {})).python
        size = cache_size()
    except ValueError as err:
        return [DoctorCheck(f"{backend}.options", "fail", str(err), f"fix the {backend} options or environment")]
    checks = [DoctorCheck(f"{backend}.model_cache", "ok", f"{cache_size_env}: {size} loaded model(s) at most")]
    if python is None:
        return [*checks, DoctorCheck(f"{backend}.engine", "warn", f"{python_env} is not set", fix)]
    if not Path(python).is_file():
        return [*checks, DoctorCheck(f"{backend}.engine", "fail", f"{python_env} names no file", fix)]
    try:
        answer = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        detail = f"the interpreter did not answer ({type(err).__name__})"
        return [*checks, DoctorCheck(f"{backend}.engine", "fail", detail, fix)]
    if answer.returncode != 0:
        return [*checks, DoctorCheck(f"{backend}.engine", "fail", missing, fix)]
    return [*checks, DoctorCheck(f"{backend}.engine", "ok", answer.stdout.strip())]

"""The oMLX adapter: one MLX checkpoint served by Werk-owned MLX workers (or the oMLX CLI on a Mac).

Creating an adapter starts nothing: it resolves the MLX interpreter (:mod:`werk_omlx.interpreter`) and
reads the model's ``config.json``. The first inference starts a worker
(:mod:`werk_omlx.workers`); routes that only observe (capabilities, expert listing and
actions, token counting) never start one, so they never load a model.

**Workers and budgets.** A worker serves the model with one expert-cache budget: that of a
positive ``werk.omlx.expert_cache_mb`` chat option, else ``WERK_OMLX_EXPERT_CACHE_MB`` (read
when the adapter is created), else none (no offload). Each budget has its own worker, at most
``omlx.max_workers`` (default 2) at once; starting another stops the least recently used idle
one. Expert requests go to the most recently used worker whose offload is active; an expert
action stays bound to the worker it started on.

**Capabilities** (docs/omlx.md, "Capabilities"), from evidence at the time of the call:
``runtime.experts.residency`` is ``experimental`` only while a loaded worker has confirmed
active offload, ``unsupported`` when the loaded model has no expert blocks it can offload, and
``unavailable`` otherwise (no worker yet, no budget, or no MLX runtime here).
``runtime.model_residency`` is ``supported`` while a worker runs, ``unavailable`` before.
``api.chat.omlx_options`` is ``supported``: the API validates the options and applies them per
request. Token counting is exact (the worker's tokenizer and template) while a worker runs.
Every ``runtime.state.*`` and ``runtime.pd.*`` id is left out: ``unsupported``.

**Hooks.** Each operation the host calls is a method marked ``@hookimpl(specname=...)``; the
host registers every adapter it creates, so a call reaches that adapter's own method. No
reasoning budget control is verified for MLX, which the reasoning profile says truthfully.

**Prefix cache.** Under ``werk serve --persistence`` with mode ``auto`` or ``disk`` and reuse
other than ``disabled``, each worker keeps its exact-prefix cache (docs/omlx.md, "Prefix cache").
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path

from pydantic import JsonValue

from werk_host.plugin import (
    CapabilityId,
    CapabilityReport,
    CapabilityStatus,
    ChatLimits,
    ChatRequest,
    ErrorCode,
    ExpertActionRequest,
    ExpertActionResult,
    ExpertListQuery,
    ExpertPage,
    HostConfig,
    InferenceResponse,
    JsonObject,
    ModelManifest,
    PersistenceMode,
    PrivateDirError,
    ReasoningProfile,
    ReusePolicy,
    WerkError,
    WorkerObservation,
    hookimpl,
)
from werk_host.plugin.checkpoints import context_length
from werk_host.plugin.http import forward
from werk_host.plugin.reasoning import unsupported_profile

from . import experts
from .backend import (
    BACKEND_ID,
    CHAT_CAPABILITIES,
    PLUGIN_NAME,
    Settings,
)
from .backend import REPORTED_CAPABILITIES as REPORTED_CAPABILITIES
from .backend import accepts as accepts
from .cli import OmlxCliServer, OmlxCliStartupError, find_omlx
from .interpreter import MlxInterpreter, MlxUnavailable, probe_interpreter, worker_python
from .options import MIB, ChatOptions, validated_options
from .workers import WorkerProcess, WorkerSpec, WorkerStartupError

log = logging.getLogger(__name__)

ENV_BUDGET = "WERK_OMLX_EXPERT_CACHE_MB"


def _unavailable(message: str, *, retryable: bool = True) -> WerkError:
    return WerkError(ErrorCode.UNAVAILABLE, message, retryable=retryable)


def env_budget_bytes() -> int | None:
    """``WERK_OMLX_EXPERT_CACHE_MB`` in bytes (unset or empty: ``None``)."""
    raw = os.environ.get(ENV_BUDGET, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) <= 0:
        raise _unavailable(f"{ENV_BUDGET} must be a positive number of MiB", retryable=False)
    return int(raw) * MIB


class OmlxAdapter:
    """Adapter for one MLX checkpoint (see the module docstring)."""

    backend = BACKEND_ID

    def __init__(
        self,
        config: HostConfig,
        manifest: ModelManifest,
        settings: Settings,
        mlx: MlxInterpreter | None,
        why_not: str | None,
        cli: Path | None,
    ) -> None:
        self.config = config
        self.manifest = manifest
        self.settings = settings
        self.mlx = mlx
        self.why_not = why_not
        self.cli = cli
        self.model_dir = manifest.primary_path.parent
        self.instance_id = f"omlx:{manifest.name}"
        self.context = context_length(self.model_dir)
        self.default_budget = env_budget_bytes()
        persistence = config.persistence
        self.prefix_cache = (
            persistence is not None
            and persistence.mode in (PersistenceMode.AUTO, PersistenceMode.DISK)
            and persistence.reuse is not ReusePolicy.DISABLED
        )
        self._workers: dict[int | None, WorkerProcess] = {}
        self._cli_server: OmlxCliServer | None = None
        self._inflight: dict[str, int] = {}
        self._lock = threading.RLock()
        self._start_lock = threading.Lock()
        self.closed = False

    # -- identity and lifecycle ------------------------------------------------------------
    def live_workers(self) -> list[WorkerProcess]:
        """Running workers, most recently used last."""
        with self._lock:
            return sorted((w for w in self._workers.values() if w.alive()), key=lambda w: w.last_used)

    def identity(self) -> str:
        live = self.live_workers()
        generation = live[-1].generation if live else "none"
        if self._cli_server is not None and self._cli_server.alive():
            generation = self._cli_server.generation
        return f"{self.instance_id}#{generation}"

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
            workers, self._workers = list(self._workers.values()), {}
            server, self._cli_server = self._cli_server, None
        for worker in workers:
            worker.stop()
        if server is not None:
            server.stop()

    def _require_mlx(self) -> MlxInterpreter:
        if self.closed:
            raise _unavailable("the oMLX adapter is shut down", retryable=False)
        if self.mlx is None:
            raise _unavailable(self.why_not or "no MLX runtime is available here", retryable=False)
        return self.mlx

    def worker(self, budget: int | None) -> WorkerProcess:
        """The running worker for ``budget``, starting one (the model loads) when none runs.

        Starts are serialised; discovery never waits for one (it reads the worker table only)."""
        mlx = self._require_mlx()
        with self._start_lock:
            with self._lock:
                current = self._workers.get(budget)
                if current is not None and current.alive():
                    current.touch()
                    return current
                if current is not None:
                    log.warning("MLX worker %s is gone; starting a new one", current.generation[:8])
                    del self._workers[budget]
                victim = self._room_for_one()
            if current is not None:
                current.stop()
            if victim is not None:
                log.info("stopping MLX worker %s to make room for another expert-cache budget", victim.generation[:8])
                victim.stop()
            spec = WorkerSpec(
                mlx=mlx,
                model_dir=self.model_dir,
                model_name=self.manifest.name,
                budget_bytes=budget,
                prefix_cache=self.prefix_cache,
                work_dir=self.config.home / "backends" / "omlx" / "workers",
                startup_timeout=self.settings.startup_timeout,
            )
            fresh = WorkerProcess(spec)
            try:
                fresh.start()
            except WorkerStartupError as err:
                log.error("the MLX worker failed to start: %s\n--- worker log (tail) ---\n%s", err.reason, err.log_tail)
                fresh.stop()
                raise _unavailable("the MLX worker failed to start; the server log has its log tail") from err
            except (OSError, PrivateDirError, WerkError) as err:
                log.error("the MLX worker could not be started: %s", err)
                fresh.stop()
                raise _unavailable("the MLX worker could not be started; the server log has the details") from err
            with self._lock:
                if self.closed:
                    fresh.stop()
                    raise _unavailable("the oMLX adapter is shut down", retryable=False)
                self._workers[budget] = fresh
            return fresh

    def _room_for_one(self) -> WorkerProcess | None:
        """Take the least recently used idle worker out of the table when the worker limit is
        reached (the caller stops it, outside the lock); ``resource_exhausted`` when all are busy."""
        live = [w for w in self._workers.values() if w.alive()]
        if len(live) < self.settings.max_workers:
            return None
        idle = sorted((w for w in live if not self._inflight.get(w.generation)), key=lambda w: w.last_used)
        if not idle:
            raise WerkError(ErrorCode.RESOURCE_EXHAUSTED, "every MLX worker of this model is busy; retry later")
        victim = idle[0]
        self._workers = {b: w for b, w in self._workers.items() if w is not victim}
        return victim

    def expert_worker(self) -> WorkerProcess | None:
        """The most recently used running worker whose offload is active."""
        active = [w for w in self.live_workers() if w.offload_active]
        return active[-1] if active else None

    # -- evidence --------------------------------------------------------------------------
    @hookimpl(specname="werk_capabilities")
    def capabilities(self) -> dict[CapabilityId, CapabilityReport]:
        reports: dict[CapabilityId, CapabilityReport] = {
            CapabilityId.OMLX_OPTIONS: CapabilityReport(
                CapabilityStatus.SUPPORTED, "werk.omlx options are validated and applied per chat request"
            ),
            CapabilityId.REASONING: CapabilityReport(
                CapabilityStatus.SUPPORTED, "answers truthfully: no reasoning budget control is verified for MLX"
            ),
        }
        if self.cli is not None:
            return reports | self._cli_capabilities()
        live = self.live_workers()
        if self.mlx is None:
            why = self.why_not or "no MLX runtime is available here"
            for cap_id in (CapabilityId.MODEL_RESIDENCY, CapabilityId.EXPERTS, *CHAT_CAPABILITIES):
                reports[cap_id] = CapabilityReport(CapabilityStatus.UNAVAILABLE, why)
            return reports
        if live:
            reports[CapabilityId.MODEL_RESIDENCY] = CapabilityReport(
                CapabilityStatus.SUPPORTED, "the weights stay loaded in the Werk-owned MLX worker"
            )
            for cap_id in CHAT_CAPABILITIES:
                reports[cap_id] = CapabilityReport(
                    CapabilityStatus.SUPPORTED, "exact counts from the worker's tokenizer and chat template"
                )
        else:
            why = "no MLX worker is running; the first chat or completion request starts one"
            reports[CapabilityId.MODEL_RESIDENCY] = CapabilityReport(CapabilityStatus.UNAVAILABLE, why)
            for cap_id in CHAT_CAPABILITIES:
                reports[cap_id] = CapabilityReport(CapabilityStatus.UNAVAILABLE, why)
        reports[CapabilityId.EXPERTS] = self._experts_report(live)
        return reports

    def _experts_report(self, live: list[WorkerProcess]) -> CapabilityReport:
        worker = self.expert_worker()
        if worker is not None:
            budget = (worker.spec.budget_bytes or 0) // MIB
            return CapabilityReport(
                CapabilityStatus.EXPERIMENTAL,
                f"the loaded MLX worker confirmed expert offload with a {budget} MiB cache",
                operations=("list", "prefetch", "pin", "unpin", "evict"),
            )
        refused = [w.offload_reason for w in live if w.offload_reason]
        if refused:
            return CapabilityReport(CapabilityStatus.UNSUPPORTED, f"this model cannot offload experts: {refused[-1]}")
        return CapabilityReport(
            CapabilityStatus.UNAVAILABLE,
            f"no loaded MLX worker has expert offload active: set {ENV_BUDGET} or send a positive "
            "werk.omlx.expert_cache_mb, then start the model through normal generation",
        )

    def _cli_capabilities(self) -> dict[CapabilityId, CapabilityReport]:
        server = self._cli_server
        alive = server is not None and server.alive()
        why = "omlx serve is not running; the first request starts it"
        reports = {
            CapabilityId.MODEL_RESIDENCY: CapabilityReport(
                CapabilityStatus.SUPPORTED if alive else CapabilityStatus.UNAVAILABLE,
                "the weights stay loaded in the Werk-started omlx serve" if alive else why,
            ),
            CapabilityId.EXPERTS: CapabilityReport(
                CapabilityStatus.UNSUPPORTED, "oMLX's native caches are backend-owned; Werk has no expert control there"
            ),
            CapabilityId.CHAT_LIMITS: CapabilityReport(
                CapabilityStatus.SUPPORTED, "context from the model's config.json, one request at a time"
            ),
        }
        return reports

    # -- chat planning ---------------------------------------------------------------------
    @hookimpl(specname="werk_request_options")
    def request_options(self, name: str, options: JsonObject) -> JsonObject | None:
        """``werk.omlx`` validated (:mod:`werk_omlx.options`); ``None`` for another backend's member."""
        return validated_options(name, options)

    @hookimpl(specname="werk_chat_limits")
    def chat_limits(self, model: str | None) -> ChatLimits:
        ceilings = [c for c in (self.manifest.output_ceiling(), self.context - 1 if self.context else None) if c]
        return ChatLimits(
            model=model or self.manifest.name,
            context_tokens=self.context,
            max_output_tokens=min(ceilings) if ceilings else None,
            max_concurrent_requests=1,
        )

    @hookimpl(specname="werk_reasoning_profile")
    def reasoning_profile(self, model: str | None, max_output_tokens: int) -> ReasoningProfile:
        return unsupported_profile(model or self.manifest.name, BACKEND_ID)

    @hookimpl(specname="werk_count_tokens")
    def count_tokens(self, request: ChatRequest) -> int:
        """Exact prompt tokens from a running worker (any budget: same tokenizer); never starts one."""
        if self.cli is not None:
            raise WerkError(ErrorCode.UNSUPPORTED, "token counting is not supported through the oMLX CLI")
        self._require_mlx()
        live = self.live_workers()
        if not live:
            raise _unavailable("no MLX worker is running to count with; the first chat request starts one")
        body = request.model_dump(mode="json", exclude_none=True, exclude={"werk", "stream", "model"})
        options = ChatOptions.of(request.model_dump(mode="json", exclude_none=True))
        if options.thinking is not None:
            body["chat_template_kwargs"] = {
                **(body.get("chat_template_kwargs") or {}),
                "enable_thinking": options.thinking,
            }
        answer = live[-1].request("POST", "/werk/count_tokens", body)
        count = answer.get("count")
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise _unavailable("the MLX worker answered without a token count")
        return count

    # -- inference -------------------------------------------------------------------------
    @hookimpl(specname="werk_chat_completion")
    def chat_completion(self, request: JsonObject) -> InferenceResponse:
        return self.relay("/v1/chat/completions", request)

    @hookimpl(specname="werk_text_completion")
    def text_completion(self, request: JsonObject) -> InferenceResponse:
        return self.relay("/v1/completions", request)

    def relay(self, path: str, request: JsonObject) -> InferenceResponse:
        options = ChatOptions.of(request)
        body: dict[str, JsonValue] = {k: v for k, v in request.items() if k != "werk"}
        body["model"] = self.manifest.name
        if options.thinking is not None:
            kwargs = body.get("chat_template_kwargs")
            merged: dict[str, JsonValue] = dict(kwargs) if isinstance(kwargs, dict) else {}
            merged["enable_thinking"] = options.thinking
            body["chat_template_kwargs"] = merged
        if self.cli is not None:
            if options.budget_bytes is not None:  # docs/omlx.md, "The oMLX CLI": its caches are its own
                raise WerkError(ErrorCode.INVALID_REQUEST, "werk.omlx.expert_cache_mb: omlx serve owns its caches")
            return forward(self._cli().pool, path, body)
        budget = options.budget_bytes if options.budget_bytes is not None else self.default_budget
        worker = self.worker(budget)
        key = worker.generation
        with self._lock:
            self._inflight[key] = self._inflight.get(key, 0) + 1
        try:
            response = forward(worker.pool, path, body)
        except BaseException:
            self._done(key)
            raise
        return self._counted(response, key)

    def _done(self, key: str) -> None:
        with self._lock:
            left = self._inflight.get(key, 1) - 1
            if left > 0:
                self._inflight[key] = left
            else:
                self._inflight.pop(key, None)

    def _counted(self, response: InferenceResponse, key: str) -> InferenceResponse:
        """``response`` with its worker counted as busy until it is closed."""
        state = {"closed": False}

        def body() -> Iterator[bytes]:
            yield from response.body

        def close() -> None:
            if not state["closed"]:
                state["closed"] = True
                try:
                    response.close()
                finally:
                    self._done(key)

        return InferenceResponse(status=response.status, headers=response.headers, body=body(), close=close)

    def _cli(self) -> OmlxCliServer:
        assert self.cli is not None
        with self._lock:
            server = self._cli_server
            if server is not None and server.alive():
                return server
            if server is not None:
                server.stop()
            fresh = OmlxCliServer(
                self.cli,
                self.model_dir,
                self.manifest.name,
                self.config.home / "backends" / "omlx" / "cli",
                self.settings.startup_timeout,
            )
            try:
                fresh.start()
            except (OmlxCliStartupError, OSError, PrivateDirError) as err:
                log.error("omlx serve could not be started: %s", err)
                fresh.stop()
                raise _unavailable("omlx serve could not be started; the server log has the details") from err
            self._cli_server = fresh
            return fresh

    # -- experts ---------------------------------------------------------------------------
    def _expert_target(self, model_id: str | None) -> WorkerProcess:
        if model_id is not None and model_id != self.manifest.name:
            raise WerkError(ErrorCode.NOT_FOUND, "model is not served here")
        worker = self.expert_worker()
        if worker is None:
            raise _unavailable(
                "no loaded MLX worker of this model has expert offload active; start the model through normal "
                "generation first (these routes never load a model)"
            )
        return worker

    @hookimpl(specname="werk_list_experts")
    def list_experts(self, query: ExpertListQuery) -> ExpertPage:
        worker = self._expert_target(query.model_id)
        return experts.list_page(worker, self.manifest.name, query)

    @hookimpl(specname="werk_expert_action")
    def expert_action(self, request: ExpertActionRequest) -> ExpertActionResult:
        worker = self._expert_target(request.model_id)
        return experts.act(worker, self.manifest.name, request)

    # -- observation -----------------------------------------------------------------------
    @hookimpl(specname="werk_workers")
    def workers(self) -> list[WorkerObservation]:
        return [
            WorkerObservation(
                model=self.manifest.name,
                backend=BACKEND_ID,
                pid=w.pid,
                state="running",
                slots=1,
                context_per_request_tokens=self.context,
                context_capacity_tokens=self.context,
            )
            for w in self.live_workers()
        ]


# -- creation ------------------------------------------------------------------------------------


def create_adapter(config: HostConfig, manifest: ModelManifest | None) -> OmlxAdapter:
    if manifest is None:
        raise WerkError(ErrorCode.INVALID_REQUEST, "the oMLX backend needs a model")
    model_dir = manifest.primary_path.parent
    if not (model_dir / "config.json").is_file():
        raise WerkError(ErrorCode.INVALID_REQUEST, "an oMLX model is a registered MLX model directory")
    settings = Settings.parse(dict(config.backend_options.get(PLUGIN_NAME, {})))
    try:
        cli = find_omlx(settings.executable)
    except FileNotFoundError as err:
        log.error("%s", err)
        raise _unavailable("the configured omlx executable is not an executable file", retryable=False) from err
    mlx: MlxInterpreter | None = None
    why_not: str | None = None
    if cli is None:
        try:
            mlx = probe_interpreter(worker_python(settings.python))
        except MlxUnavailable as err:
            why_not = err.reason
    return OmlxAdapter(config, manifest, settings, mlx, why_not, cli)

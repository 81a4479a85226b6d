"""The vLLM adapter: a thin, truthful host over a Werk-started local server or a remote endpoint.

Two kinds of target sit behind one adapter class (:mod:`werk_vllm.targets`):

* **local** (:class:`~werk_vllm.targets.LocalTarget`): a registered Hugging Face model directory
  served by a Werk-started ``vllm serve`` (:mod:`werk_vllm.server`), shared by every adapter with
  the same launch key, restarted as a new generation after it died, stopped with the last adapter.
* **remote** (:class:`~werk_vllm.targets.RemoteTarget`): an ``endpoint`` some other machine runs.
  Nothing is launched; health is ``GET /health`` (else ``GET /v1/models``); the API key comes
  from the environment variable ``api_key_env`` names, read once when the adapter is created.

Each operation the host calls is a method marked ``@hookimpl(specname=...)``; the host
registers every adapter it creates, so a call reaches that adapter's own method.

An adapter is a chat, an embedding or a reranking instance (:mod:`werk_vllm.embeddings`): the
``pooling`` option or, without it, the routes vLLM registered say which, once, when the adapter
is created, and an embedding instance measures its limits then. An embedding instance refuses
chat and completion requests (``invalid_request``) and reports every chat and state capability
``unsupported``.

Everything reported is read from evidence at the time: a live process and its effective argv,
an endpoint that answers, vLLM's ``/v1/models`` and ``/metrics``. vLLM exposes no named state,
snapshot, restore, tier or expert control, so none of those capabilities is reported (the host
answers them ``unsupported``) and none of their hooks is implemented. No reasoning budget
control is verified for vLLM, which the reasoning profile says truthfully.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from collections import OrderedDict
from typing import Any

from pydantic import JsonValue

from werk_host.plugin import (
    CapabilityId,
    CapabilityReport,
    CapabilityStatus,
    ChatLimits,
    ChatRequest,
    DeploymentPlan,
    EmbeddingLimits,
    EmbeddingResult,
    EmbeddingWork,
    EndpointKind,
    ErrorCode,
    HostConfig,
    InferenceResponse,
    JsonObject,
    ModelManifest,
    ReasoningProfile,
    RerankResult,
    RerankWork,
    WerkError,
    WorkerObservation,
    hookimpl,
)
from werk_host.plugin.http import forward, post_json
from werk_host.plugin.reasoning import unsupported_profile

from . import embeddings
from . import server as servers
from .apc import injected_flag, prefix_cache_report
from .backend import BACKEND_ID, CHAT_CAPABILITIES, PLUGIN_NAME
from .backend import REPORTED_CAPABILITIES as REPORTED_CAPABILITIES
from .backend import accepts as accepts
from .client import get, get_json
from .embeddings import CHAT, EMBED, RERANK, Kind
from .executable import InspectionError, VllmNotFound, find_vllm, flag_name, inspect_vllm
from .launch import (
    LaunchSettings,
    RemoteSettings,
    display_args,
    env_args,
    generated_args,
    int_flag,
    parse_options,
)
from .metrics import VllmMetrics, parse_metrics
from .server import LaunchSpec
from .targets import Live, LocalTarget, RemoteTarget, Target, served_max_model_len, served_names

log = logging.getLogger(__name__)

#: Chat-request members that change the prompt vLLM renders, passed to ``/tokenize`` as they are.
TOKENIZE_PASSED = (
    "tools",
    "chat_template",
    "add_generation_prompt",
    "continue_final_message",
    "add_special_tokens",
    "mm_processor_kwargs",
    "media_io_kwargs",
)
REMOTE_MODELS_TTL_S = 30.0
CHAT_INSTANCE = "a chat instance: set the pooling option for an embedding or reranking instance"
COUNT_CACHE = 256


def _unavailable(message: str, *, retryable: bool = True) -> WerkError:
    return WerkError(ErrorCode.UNAVAILABLE, message, retryable=retryable)


class VllmAdapter:
    """Adapter for one model served by vLLM (see the module docstring)."""

    backend = BACKEND_ID

    def __init__(self, config: HostConfig, manifest: ModelManifest, target: Target, pooling: str | None = None) -> None:
        self.config = config
        self.manifest = manifest
        self.target = target
        self.served_name = manifest.name
        remote = isinstance(target, RemoteTarget)
        self.instance_id = f"vllm:{'remote:' if remote else ''}{manifest.name}"
        self._lock = threading.Lock()
        self._max_len: int | None = None
        self._max_len_at = -1e9
        self._counts: OrderedDict[str, int] = OrderedDict()
        self.closed = False
        #: the ``pooling`` option (``None``: none given)
        self.pooling = pooling
        #: chat, embed or rank: the option's, else vLLM's answer in :meth:`settle`
        self.kind: Kind = embeddings.kind_of(pooling) or CHAT
        self._limits: EmbeddingLimits | None = None
        #: the process generation that last answered an embedding or rerank request
        self._answered: str | None = None

    @property
    def remote(self) -> bool:
        return isinstance(self.target, RemoteTarget)

    # -- identity and lifecycle ------------------------------------------------------------
    def identity(self) -> str:
        """Changes whenever the local process is replaced; stable per adapter for a remote endpoint."""
        target = self.target
        if isinstance(target, RemoteTarget):
            return f"{self.instance_id}#{target.generation}"
        proc = target.server.current()
        return f"{self.instance_id}#{proc.generation if proc is not None else 'none'}"

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
        self.target.close()

    def live(self) -> Live | None:
        return None if self.closed else self.target.live()

    def connect(self) -> Live:
        if self.closed:
            raise _unavailable("the vLLM adapter is shut down", retryable=False)
        return self.target.connect()

    def effective_argv(self) -> tuple[str, ...] | None:
        """The effective argv of the running Werk-started process (``None`` remote or stopped)."""
        live = self.live()
        return live.argv if live is not None else None

    # -- evidence --------------------------------------------------------------------------
    @hookimpl(specname="werk_capabilities")
    def capabilities(self) -> dict[CapabilityId, CapabilityReport]:
        if self.kind != CHAT:
            return self.pooling_capabilities()
        live = self.live()
        remote = self.remote
        reports: dict[CapabilityId, CapabilityReport] = {
            CapabilityId.EMBEDDINGS: CapabilityReport(CapabilityStatus.UNSUPPORTED, CHAT_INSTANCE),
            CapabilityId.RERANK: CapabilityReport(CapabilityStatus.UNSUPPORTED, CHAT_INSTANCE),
        }
        if live is None:
            why = "the remote vLLM endpoint is not answering" if remote else "no vLLM process is running"
            reports[CapabilityId.MODEL_RESIDENCY] = CapabilityReport(CapabilityStatus.UNAVAILABLE, why)
        elif remote:
            reports[CapabilityId.MODEL_RESIDENCY] = CapabilityReport(
                CapabilityStatus.EXTERNALLY_MANAGED, "the remote vLLM endpoint holds the model; Werk does not manage it"
            )
        else:
            reports[CapabilityId.MODEL_RESIDENCY] = CapabilityReport(
                CapabilityStatus.SUPPORTED, "the weights stay loaded in the Werk-started vLLM process"
            )
        argv: tuple[str, ...] | None = None
        if live is not None:
            argv = live.argv if live.argv is not None else ()
        reports[CapabilityId.PREFIX_CACHE] = prefix_cache_report(argv, remote=remote)
        for cap_id, detail in CHAT_CAPABILITIES:
            if live is not None:
                reports[cap_id] = CapabilityReport(CapabilityStatus.SUPPORTED, detail)
            else:
                why = "the remote vLLM endpoint is not answering" if remote else "no vLLM process is running"
                reports[cap_id] = CapabilityReport(CapabilityStatus.UNAVAILABLE, why)
        reports[CapabilityId.REASONING] = CapabilityReport(
            CapabilityStatus.SUPPORTED, "answers truthfully: no reasoning budget control is verified for vLLM"
        )
        return reports

    def describe(self) -> str:
        """What this instance is, in words (capabilities and refusals)."""
        if self.kind == RERANK:
            return "a reranking instance (vLLM's pooling runner)"
        pooling = f"{self.pooling} pooling" if self.pooling else "the model's pooling"
        return f"an embedding instance (vLLM's pooling runner, {pooling})"

    def pooling_capabilities(self) -> dict[CapabilityId, CapabilityReport]:
        """An embedding or reranking instance's reports: its own id ``supported`` once the live
        process answered as that kind, every chat and state id ``unsupported``."""
        live = self.live()
        kind = self.describe()
        reports = {
            cap_id: CapabilityReport(CapabilityStatus.UNSUPPORTED, f"{kind}: no chat, no states")
            for cap_id in REPORTED_CAPABILITIES
        }
        if live is None:
            why = "the remote vLLM endpoint is not answering" if self.remote else "no vLLM process is running"
            reports[CapabilityId.MODEL_RESIDENCY] = CapabilityReport(CapabilityStatus.UNAVAILABLE, why)
        elif self.remote:
            reports[CapabilityId.MODEL_RESIDENCY] = CapabilityReport(
                CapabilityStatus.EXTERNALLY_MANAGED, "the remote vLLM endpoint holds the model; Werk does not manage it"
            )
        else:
            reports[CapabilityId.MODEL_RESIDENCY] = CapabilityReport(
                CapabilityStatus.SUPPORTED, "the weights stay loaded in the Werk-started vLLM process"
            )
        mine, other = (
            (CapabilityId.RERANK, CapabilityId.EMBEDDINGS)
            if self.kind == RERANK
            else (CapabilityId.EMBEDDINGS, CapabilityId.RERANK)
        )
        if live is not None and live.generation == self._answered:
            reports[mine] = CapabilityReport(CapabilityStatus.SUPPORTED, f"vLLM answered as {kind}")
        else:
            reports[mine] = CapabilityReport(CapabilityStatus.UNAVAILABLE, "this vLLM process has not answered yet")
        reports[other] = CapabilityReport(CapabilityStatus.UNSUPPORTED, kind)
        return reports

    def max_model_len(self, live: Live | None) -> int | None:
        """The served context: vLLM's ``/v1/models`` ``max_model_len`` (cached: per launch key
        locally, for a short while remotely), else ``--max-model-len`` of the launch."""
        now = time.monotonic()
        with self._lock:
            known, at = self._max_len, self._max_len_at
        if known is not None and (not self.remote or now - at < REMOTE_MODELS_TTL_S):
            return known
        found = served_max_model_len(get_json(live.pool, "/v1/models"), self.served_name) if live else None
        if found is not None:
            with self._lock:
                self._max_len, self._max_len_at = found, now
            return found
        if self.remote:
            return known if live is not None else None
        target = self.target
        assert isinstance(target, LocalTarget)
        return int_flag(target.spec.planned[1:], "--max-model-len")

    def max_num_seqs(self) -> int | None:
        target = self.target
        if isinstance(target, RemoteTarget):
            return None
        return int_flag(target.spec.planned[1:], "--max-num-seqs")

    # -- chat planning ---------------------------------------------------------------------
    @hookimpl(specname="werk_chat_limits")
    def chat_limits(self, model: str | None) -> ChatLimits:
        context = self.max_model_len(self.live())
        ceilings = [c for c in (self.manifest.output_ceiling(), context - 1 if context else None) if c]
        return ChatLimits(
            model=model or self.served_name,
            context_tokens=context,
            max_output_tokens=min(ceilings) if ceilings else None,
            max_concurrent_requests=self.max_num_seqs(),
            # vLLM's scheduler queues what its batch cannot take (and so does a remote server).
            engine_queues=True,
        )

    def tokenize_body(self, request: ChatRequest) -> dict[str, Any]:
        """The ``POST /tokenize`` body that renders ``request`` exactly as chat completions would."""
        body = request.model_dump(mode="json", exclude_none=True, exclude={"werk", "stream", "model"})
        payload: dict[str, Any] = {
            "model": self.served_name,
            "messages": body["messages"],
            "add_generation_prompt": True,
        }
        for key in TOKENIZE_PASSED:
            if key in body:
                payload[key] = body[key]
        # vLLM's chat endpoint lays these over the caller's chat_template_kwargs (merge_kwargs).
        user = body.get("chat_template_kwargs")
        kwargs: dict[str, Any] = dict(user) if isinstance(user, dict) else {}
        extra: dict[str, Any] = {}
        if body.get("documents") is not None:
            extra["documents"] = body["documents"]
        effort = body.get("reasoning_effort")
        if effort is not None and effort != "auto":
            extra["reasoning_effort"] = effort
        if effort is not None and "enable_thinking" not in kwargs:
            extra["enable_thinking"] = effort != "none"
        kwargs.update(extra)
        if kwargs:
            payload["chat_template_kwargs"] = kwargs
        return payload

    @hookimpl(specname="werk_reasoning_profile")
    def reasoning_profile(self, model: str | None, max_output_tokens: int) -> ReasoningProfile:
        return unsupported_profile(model or self.served_name, BACKEND_ID)

    @hookimpl(specname="werk_count_tokens")
    def count_tokens(self, request: ChatRequest) -> int:
        self.refuse_chat()
        payload = self.tokenize_body(request)
        live = self.connect()
        key = hashlib.sha256(
            json.dumps([self.identity(), payload], sort_keys=True, separators=(",", ":")).encode()
        ).hexdigest()
        with self._lock:
            if key in self._counts:
                self._counts.move_to_end(key)
                return self._counts[key]
        try:
            answer = post_json(live.pool, live.pool.path("/tokenize"), payload)
        except WerkError as err:
            if err.code is ErrorCode.INVALID_REQUEST:
                raise
            raise _unavailable("vLLM could not count this request") from err
        count = answer.get("count")
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            tokens = answer.get("tokens")
            if not isinstance(tokens, list):
                raise _unavailable("vLLM answered /tokenize without a token count")
            count = len(tokens)
        with self._lock:
            self._counts[key] = count
            while len(self._counts) > COUNT_CACHE:
                self._counts.popitem(last=False)
        return count

    # -- inference ---------------------------------------------------------------------------
    @hookimpl(specname="werk_chat_completion")
    def chat_completion(self, request: JsonObject) -> InferenceResponse:
        return self.relay("/v1/chat/completions", request)

    @hookimpl(specname="werk_text_completion")
    def text_completion(self, request: JsonObject) -> InferenceResponse:
        return self.relay("/v1/completions", request)

    def refuse_chat(self) -> None:
        """An embedding or reranking instance generates no text: ``invalid_request``, never relayed."""
        if self.kind != CHAT:
            raise WerkError(
                ErrorCode.INVALID_REQUEST,
                f"model {self.served_name} is {self.describe()}: it "
                + ("reranks documents" if self.kind == RERANK else "computes embeddings")
                + " and generates no chat or completions",
            )

    def relay(self, path: str, request: JsonObject) -> InferenceResponse:
        self.refuse_chat()
        live = self.connect()
        body: dict[str, JsonValue] = {k: v for k, v in request.items() if k != "werk"}
        body["model"] = self.served_name
        return forward(live.pool, live.pool.path(path), body)

    # -- embeddings and reranking ----------------------------------------------------------------
    def settle(self) -> None:
        """Decide the kind (without a ``pooling`` option, from vLLM's routes) and measure an
        embedding or reranking instance (:mod:`werk_vllm.embeddings`); run once, at creation."""
        live = self.connect()
        if self.pooling is None:
            self.kind = embeddings.served_kind(live.pool)
        if self.kind != CHAT:
            self.measure(live)

    def measure(self, live: Live) -> EmbeddingLimits:
        limits = embeddings.measure(
            live.pool, self.served_name, self.kind, self.pooling, self.max_model_len(live), self.max_num_seqs()
        )
        with self._lock:
            self._limits, self._answered = limits, live.generation
        return limits

    @hookimpl(specname="werk_embedding_limits")
    def embedding_limits(self) -> EmbeddingLimits | None:
        if self.kind == CHAT:
            return None
        limits = self._limits
        return limits if limits is not None else self.measure(self.connect())

    def _pooling_instance(self, kind: Kind) -> Live:
        if self.kind != kind:
            what = "a chat instance" if self.kind == CHAT else self.describe()
            does = "reranks" if kind == RERANK else "embeds"
            raise WerkError(ErrorCode.INVALID_REQUEST, f"model {self.served_name} is {what}: it {does} nothing")
        return self.connect()

    @hookimpl(specname="werk_embed")
    def embed(self, work: EmbeddingWork) -> EmbeddingResult:
        live = self._pooling_instance(EMBED)
        vectors, tokens = embeddings.embed(live.pool, self.served_name, list(work.inputs))
        self._answered = live.generation
        return EmbeddingResult(vectors=vectors, prompt_tokens=tokens)

    @hookimpl(specname="werk_rerank")
    def rerank(self, work: RerankWork) -> RerankResult:
        live = self._pooling_instance(RERANK)
        scores, tokens = embeddings.rerank(live.pool, self.served_name, work.query, list(work.documents))
        self._answered = live.generation
        return RerankResult(scores=scores, prompt_tokens=tokens)

    @hookimpl(specname="werk_tokenize")
    def tokenize(self, text: str) -> list[int] | None:
        if self.kind == CHAT:
            return None
        live = self.connect()
        return embeddings.tokenize(live.pool, self.served_name, text)

    # -- observation -------------------------------------------------------------------------
    def metrics(self, live: Live) -> VllmMetrics:
        answer = get(live.pool, "/metrics")
        if answer is None or answer[0] != 200:
            return VllmMetrics()
        try:
            return parse_metrics(answer[1].decode("utf-8", errors="replace"))
        except ValueError:
            log.warning("vLLM /metrics is not Prometheus text")
            return VllmMetrics()

    @hookimpl(specname="werk_workers")
    def workers(self) -> list[WorkerObservation]:
        live = self.live()
        if live is None:
            return []
        sample = self.metrics(live)
        return [
            WorkerObservation(
                model=self.served_name,
                backend=BACKEND_ID,
                pid=live.pid,
                state="running",
                slots=self.max_num_seqs(),
                context_per_request_tokens=self.max_model_len(live),
                context_capacity_tokens=sample.kv_capacity_tokens,
                requests_running=sample.requests_running,
                requests_waiting=sample.requests_waiting,
                kv_cache_usage=sample.kv_cache_usage,
                prefix_cache_hit_rate=sample.prefix_cache_hit_rate,
            )
        ]

    @hookimpl(specname="werk_deployment_plan")
    def plan(self) -> DeploymentPlan | None:
        """The running server's placement (``None`` when nothing answers): its effective launch
        arguments (paths ``<path>``, secrets ``<redacted>``; none known for a remote endpoint),
        ``--max-num-seqs`` as slots, ``max_model_len`` as context per slot, and ``cpu`` as the
        device when the installed vLLM is a ``+cpu`` build."""
        live = self.live()
        if live is None:
            return None
        target = self.target
        if isinstance(target, RemoteTarget):
            return DeploymentPlan(
                endpoint=EndpointKind.REMOTE,
                arguments=[],
                threads=None,
                parallel_slots=None,
                context_per_slot=self.max_model_len(live),
                device=None,
            )
        argv = live.argv or ()
        paths = (str(target.model_dir), str(target.spec.executable.path), argv[0] if argv else "")
        return DeploymentPlan(
            endpoint=EndpointKind.LOCAL,
            arguments=display_args(argv[1:], paths),
            threads=None,
            parallel_slots=self.max_num_seqs(),
            context_per_slot=self.max_model_len(live),
            device="cpu" if target.spec.version.endswith("+cpu") else None,
        )


# -- creation ------------------------------------------------------------------------------------


def _remote_key(settings: RemoteSettings) -> str | None:
    if settings.api_key_env is None:
        return None
    key = os.environ.get(settings.api_key_env)
    if not key:
        raise _unavailable(
            f"the environment variable {settings.api_key_env} named by api_key_env is not set", retryable=False
        )
    return key


def _create_remote(config: HostConfig, manifest: ModelManifest, settings: RemoteSettings) -> VllmAdapter:
    try:
        target = RemoteTarget(settings, _remote_key(settings))
    except ValueError as err:
        raise WerkError(ErrorCode.INVALID_REQUEST, "backend option vllm.endpoint is not a usable URL") from err
    adapter = VllmAdapter(config, manifest, target)
    try:
        if not target.reachable():
            raise _unavailable(f"the remote vLLM endpoint for model {manifest.name} is not answering")
        answer = get(target.pool, "/v1/models")
        if answer is not None and answer[0] in (401, 403):
            raise _unavailable(
                f"the remote vLLM endpoint for model {manifest.name} refused Werk's API key (see api_key_env)",
                retryable=False,
            )
        names = served_names(get_json(target.pool, "/v1/models"))
        if names and manifest.name not in names:
            raise _unavailable(
                f"the remote vLLM endpoint does not serve a model named {manifest.name}", retryable=False
            )
        adapter.settle()
    except BaseException:
        adapter.close()
        raise
    return adapter


def _create_local(config: HostConfig, manifest: ModelManifest, settings: LaunchSettings) -> VllmAdapter:
    if not manifest.files:
        raise WerkError(ErrorCode.INVALID_REQUEST, "a local vLLM model is a registered Hugging Face model directory")
    model_dir = manifest.primary_path.parent
    if not model_dir.is_dir():
        raise WerkError(ErrorCode.NOT_FOUND, f"the model directory of {manifest.name} is gone")
    try:
        executable = find_vllm(settings.executable)
    except VllmNotFound as err:
        log.error("%s", err)
        raise _unavailable(
            "vLLM is not installed here: set WERK_VLLM, put vllm on PATH or pass --backend-option vllm.executable=PATH",
            retryable=False,
        ) from err
    work_dir = config.home / "backends" / "vllm"
    try:
        served = inspect_vllm(executable, work_dir / "flags")
    except InspectionError as err:
        log.error("vllm could not be inspected: %s", err)
        raise _unavailable(
            "the vLLM executable could not be inspected (vllm serve --help=all failed)", retryable=False
        ) from err
    trailing = env_args()
    if any(flag_name(a) == "--api-key" for a in trailing):
        raise WerkError(ErrorCode.INVALID_REQUEST, "WERK_VLLM_ARGS must not set --api-key: Werk gives vLLM its own key")
    generated = generated_args(str(model_dir), manifest.name, settings, injected_flag(config.persistence, trailing))
    missing = served.missing(generated)
    if missing:
        version = served.version or "of unknown version"
        raise _unavailable(
            f"the installed vLLM {version} has no {', '.join(missing)} option: it is incompatible with this "
            "plugin (install a vLLM that has it, or drop the option that needs it)",
            retryable=False,
        )
    spec = LaunchSpec(
        manifest_identity=manifest.identity,
        executable=served.identity,
        planned=(str(executable), *generated, *trailing),
        version=served.version,
        work_dir=work_dir,
        startup_timeout=settings.startup_timeout,
    )
    target = LocalTarget(servers.acquire(spec), model_dir)
    adapter = VllmAdapter(config, manifest, target, settings.pooling)
    try:
        adapter.settle()  # residency: the server starts with the instance
    except BaseException:
        adapter.close()
        raise
    return adapter


def create_adapter(config: HostConfig, manifest: ModelManifest | None) -> VllmAdapter:
    if manifest is None:
        raise WerkError(ErrorCode.INVALID_REQUEST, "the vLLM backend needs a model")
    settings = parse_options(dict(config.backend_options.get(PLUGIN_NAME, {})))
    if isinstance(settings, RemoteSettings):
        return _create_remote(config, manifest, settings)
    return _create_local(config, manifest, settings)

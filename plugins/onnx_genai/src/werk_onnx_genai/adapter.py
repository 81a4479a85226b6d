"""The ONNX GenAI adapter: one deployment instance of a GenAI model directory, served by the
plugin's CPU worker for that exact model (a :class:`~werk_host.plugin.pool.WorkerPool` keyed by
the model's files and the runtime settings; docs/onnx-genai.md, "Workers and the model LRU").

What it claims, each from evidence (docs/plugin-kit.md, "Capabilities"):

* ``runtime.model_residency``: ``supported`` while this model's worker is alive (its health
  route answers only once the model is loaded), ``unavailable`` when the LRU stopped it or it
  died (the next request loads it again).
* ``api.chat.token_count`` and ``api.chat.admission``: exact, the model's own tokenizer and chat
  template in the worker, the same code that builds the prompt the usage counts.
* ``api.chat.limits``: the context is ``model.context_length`` of ``genai_config.json``; the output
  ceiling the manifest's ``max_output_tokens`` param, else the context less one; one request at a
  time (the worker is serialized).
* ``runtime.state.prefix_cache``: ``unsupported``: each request gets a new generator and prompt
  state (the seed's ONNX Runtime Python GenAI row).

A chat that forces a tool call is refused (``invalid_request``): the engine cannot constrain its
output to a schema, and a forced choice is made real or refused, never ignored
(docs/plugin-kit.md, "Tool calls").
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

from werk_host.plugin import (
    CapabilityId,
    CapabilityReport,
    CapabilityStatus,
    ChatLimits,
    ChatRequest,
    ErrorCode,
    HostConfig,
    InferenceResponse,
    JsonObject,
    ModelManifest,
    WerkError,
    hookimpl,
)
from werk_host.plugin.http import ConnectionPool, forward, post_json
from werk_host.plugin.pool import Slot, Started, WorkerPool, files_identity
from werk_host.plugin.process import BackendStartupError
from werk_host.plugin.workers import LOOPBACK, WorkerRun

from .settings import Settings, cache_size, parse_options

__all__ = ["BACKEND_ID", "REPORTED", "OnnxGenaiAdapter", "accepts", "create_adapter"]

BACKEND_ID = "onnx-genai"
WORKER = Path(__file__).with_name("worker.py")
CONFIG_NAME = "genai_config.json"
KEY_ENV = "WERK_ONNX_GENAI_WORKER_KEY"
REPORTED = (
    CapabilityId.MODEL_RESIDENCY,
    CapabilityId.TOKEN_COUNT,
    CapabilityId.ADMISSION,
    CapabilityId.CHAT_LIMITS,
    CapabilityId.PREFIX_CACHE,
)
POOL = WorkerPool(cache_size)


class WorkerStartupError(BackendStartupError):
    """The ONNX GenAI worker did not load its model."""


def _forced_tool_choice(body: JsonObject) -> bool:
    choice = body.get("tool_choice")
    return choice == "required" or isinstance(choice, dict)


class OnnxGenaiAdapter:
    backend = BACKEND_ID

    def __init__(self, config: HostConfig, manifest: ModelManifest, settings: Settings, directory: Path) -> None:
        if settings.python is None:
            raise WerkError(
                ErrorCode.UNAVAILABLE,
                "the onnx-genai backend needs its engine interpreter: set WERK_ONNX_GENAI_PYTHON "
                "(bash scripts/setup-engine-venv.sh onnx-genai prints it) or onnx-genai.python",
                retryable=False,
            )
        self.config = config
        self.manifest = manifest
        self.settings = settings
        self.directory = directory
        self.instance_id = f"{BACKEND_ID}:{manifest.name}"
        self.context = genai_context(directory)
        # The exact model and the interpreter that runs it (docs/onnx-genai.md).
        self.key = (files_identity(manifest), settings.python)
        self.slot: Slot = POOL.attach(self.key, id(self))
        self._closed = threading.Event()

    # -- lifetime -----------------------------------------------------------------------------
    def identity(self) -> str:
        return f"{self.instance_id}#{self.slot.generation() or 'not-loaded'}"

    def load(self) -> None:
        """Make sure this model's worker is alive (started now when it is not)."""
        with POOL.use(self.slot, self._start):
            pass

    def restart(self) -> None:
        """Replace the worker by a new process (a new generation)."""
        self.slot.stop()
        self.load()

    def close(self) -> None:
        if not self._closed.is_set():
            self._closed.set()
            POOL.detach(self.key, id(self))

    def _start(self) -> Started:
        settings = self.settings
        assert settings.python is not None
        run = WorkerRun(
            f"ONNX GenAI worker ({self.manifest.name})",
            self.config.home / "backends" / BACKEND_ID / "workers",
            prefix="worker-",
            error_type=WorkerStartupError,
            key_env=KEY_ENV,
        )
        argv = [settings.python, str(WORKER), "--model", str(self.directory), "--port", str(run.port)]
        try:
            run.start(argv, log_name="worker.log", startup_timeout=settings.startup_timeout, guard="group")
        except WorkerStartupError as err:
            raise WerkError(
                ErrorCode.UNAVAILABLE, "the ONNX GenAI worker could not load the model", retryable=True
            ) from err
        pool = ConnectionPool(
            LOOPBACK, run.port, api_key=run.key, label="ONNX GenAI worker", bounds=self.config.backend_bounds
        )
        return Started(run, pool)

    # -- operation hooks (docs/plugin-hooks.md) --------------------------------------------------
    @hookimpl(specname="werk_capabilities")
    def capabilities(self) -> dict[CapabilityId, CapabilityReport]:
        alive = self.slot.alive()
        residency = (
            CapabilityReport(CapabilityStatus.SUPPORTED, "the model is loaded in its live ONNX GenAI worker")
            if alive
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
        with POOL.use(self.slot, self._start) as started:
            answer = post_json(started.pool, "/count", counted)
        tokens = answer.get("prompt_tokens")
        if not isinstance(tokens, int):
            raise WerkError(ErrorCode.UNAVAILABLE, "the ONNX GenAI worker answered no count", retryable=True)
        return tokens

    @hookimpl(specname="werk_chat_completion")
    def chat_completion(self, request: JsonObject) -> InferenceResponse:
        body = {k: v for k, v in request.items() if k != "werk"}
        if _forced_tool_choice(body):
            raise WerkError(
                ErrorCode.INVALID_REQUEST,
                "tool_choice cannot force a call on backend onnx-genai (it cannot constrain its output)",
            )
        use = POOL.use(self.slot, self._start)
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


def genai_dir(manifest: ModelManifest | None) -> Path | None:
    """The directory of ``manifest`` when it is one GenAI model directory: all its files side by
    side, ``genai_config.json`` among them."""
    if manifest is None or not manifest.files:
        return None
    paths = [Path(f.path) for f in manifest.files]
    parent = paths[0].parent
    if any(p.parent != parent for p in paths) or CONFIG_NAME not in {p.name for p in paths}:
        return None
    return parent


def genai_context(directory: Path) -> int | None:
    """``model.context_length`` of ``genai_config.json`` (``None`` when absent or malformed)."""
    try:
        with (directory / CONFIG_NAME).open(encoding="utf-8") as handle:
            doc = json.loads(handle.read(1 << 20))
    except (OSError, ValueError):
        return None
    model = doc.get("model") if isinstance(doc, dict) else None
    length = model.get("context_length") if isinstance(model, dict) else None
    return length if isinstance(length, int) and not isinstance(length, bool) and length > 0 else None


def accepts(manifest: ModelManifest | None) -> bool:
    """A manifest pinned to this backend, or an unpinned GenAI model directory
    (``genai_config.json``; no other installed backend reads one)."""
    if manifest is None:
        return False
    if manifest.backend is not None:
        return manifest.backend == BACKEND_ID
    return genai_dir(manifest) is not None


def create_adapter(config: HostConfig, manifest: ModelManifest | None) -> OnnxGenaiAdapter:
    if manifest is None:
        raise WerkError(ErrorCode.INVALID_REQUEST, "the onnx-genai backend needs a model")
    directory = genai_dir(manifest)
    if directory is None:
        raise WerkError(
            ErrorCode.INVALID_REQUEST, f"model {manifest.name} is not a GenAI model directory (genai_config.json)"
        )
    try:
        settings = parse_options(config.backend_options.get(BACKEND_ID, {}))
        cache_size()
    except ValueError as err:
        raise WerkError(ErrorCode.INVALID_REQUEST, f"onnx-genai options: {err}") from err
    adapter = OnnxGenaiAdapter(config, manifest, settings, directory)
    try:
        adapter.load()
    except BaseException:
        adapter.close()
        raise
    return adapter

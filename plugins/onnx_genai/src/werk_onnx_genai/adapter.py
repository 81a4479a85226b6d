"""The ONNX GenAI adapter: one deployment instance of a GenAI model directory, served by the
plugin's CPU worker for that exact model (the kit's :class:`~werk_host.plugin.engines.EngineAdapter`:
a :class:`~werk_host.plugin.pool.WorkerPool` keyed by the model's files and the engine
interpreter; docs/onnx-genai.md, "Workers and the model LRU").

What it claims, each from evidence (docs/plugin-kit.md, "Capabilities" and "Engine workers"):
``runtime.model_residency`` while this model's worker is alive; ``api.chat.token_count`` and
``api.chat.admission`` exact, the model's own tokenizer and chat template in the worker;
``api.chat.limits``: the context is ``model.context_length`` of ``genai_config.json``, one
request at a time; ``runtime.state.prefix_cache`` ``unsupported``: each request gets a new
generator and prompt state (the seed's ONNX Runtime Python GenAI row). A chat that forces a tool
call is refused.

What is this engine's own: which manifests it takes (a GenAI model directory, all files side by
side with ``genai_config.json``) and the context from ``genai_config.json``.
"""

from __future__ import annotations

import json
from pathlib import Path

from werk_host.plugin import ErrorCode, HostConfig, ModelManifest, WerkError
from werk_host.plugin.engines import REPORTED, EngineAdapter, started
from werk_host.plugin.pool import WorkerPool

from .settings import PYTHON_ENV, Settings, cache_size, parse_options

__all__ = ["BACKEND_ID", "REPORTED", "OnnxGenaiAdapter", "accepts", "create_adapter"]

BACKEND_ID = "onnx-genai"
WORKER = Path(__file__).with_name("worker.py")
CONFIG_NAME = "genai_config.json"
POOL = WorkerPool(cache_size)


class OnnxGenaiAdapter(EngineAdapter):
    backend = BACKEND_ID
    label = "ONNX GenAI"
    python_env = PYTHON_ENV
    key_env = "WERK_ONNX_GENAI_WORKER_KEY"
    worker = WORKER
    pool = POOL

    def __init__(self, config: HostConfig, manifest: ModelManifest, settings: Settings, directory: Path) -> None:
        self.settings = settings
        # The exact model and the interpreter that runs it (docs/onnx-genai.md).
        super().__init__(
            config,
            manifest,
            directory,
            python=settings.python,
            startup_timeout=settings.startup_timeout,
            context=genai_context(directory),
        )


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
    return started(OnnxGenaiAdapter(config, manifest, settings, directory))

"""The transformers adapter: one deployment instance of a Hugging Face checkpoint, served by the
plugin's worker for that exact model (the kit's :class:`~werk_host.plugin.engines.EngineAdapter`:
a :class:`~werk_host.plugin.pool.WorkerPool` keyed by the model's files and the runtime
settings; docs/transformers.md, "Workers and the model LRU").

What it claims, each from evidence (docs/plugin-kit.md, "Capabilities" and "Engine workers"):
``runtime.model_residency`` while this model's worker is alive; ``api.chat.token_count`` and
``api.chat.admission`` exact, the model's own tokenizer and chat template in the worker;
``api.chat.limits``: the context is ``max_position_embeddings`` of ``config.json``, one request
at a time; ``runtime.state.prefix_cache`` ``unsupported``: only the running generation keeps a
KV cache (the seed's Transformers row). A chat that forces a tool call is refused.
``api.embeddings`` and ``api.rerank`` are ``unsupported`` on a chat instance; an embedding instance
(the ``pooling`` option, or an encoder checkpoint) is
:class:`werk_transformers.embeddings.TransformersEmbeddingAdapter` instead.

What is this engine's own: which manifests it takes (an unpinned Hugging Face checkpoint
directory that is not an MLX conversion), the context from ``config.json``, and the worker's
``--device``, ``--dtype`` and ``--threads``, which are also part of the worker's key.
"""

from __future__ import annotations

from pathlib import Path

from werk_host.plugin import (
    CapabilityId,
    CapabilityReport,
    CapabilityStatus,
    ErrorCode,
    HostConfig,
    ModelManifest,
    WerkError,
    hookimpl,
)
from werk_host.plugin.checkpoints import checkpoint_dir, context_length, safetensors_metadata
from werk_host.plugin.engines import EngineAdapter, started

from .core import BACKEND_ID, KEY_ENV, POOL, REPORTED, WORKER
from .embeddings import TransformersEmbeddingAdapter, instance_pooling
from .settings import PYTHON_ENV, Settings, cache_size, parse_options

__all__ = [
    "BACKEND_ID",
    "POOL",
    "REPORTED",
    "WORKER",
    "TransformersAdapter",
    "TransformersEmbeddingAdapter",
    "accepts",
    "create_adapter",
]


class TransformersAdapter(EngineAdapter):
    backend = BACKEND_ID
    label = "transformers"
    python_env = PYTHON_ENV
    key_env = KEY_ENV
    worker = WORKER
    pool = POOL

    def __init__(self, config: HostConfig, manifest: ModelManifest, settings: Settings, directory: Path) -> None:
        self.settings = settings
        # The exact model and every setting that changes what runs (docs/transformers.md).
        super().__init__(
            config,
            manifest,
            directory,
            python=settings.python,
            startup_timeout=settings.startup_timeout,
            context=context_length(directory),
            runtime=(settings.device, settings.dtype, settings.threads),
        )

    def worker_args(self) -> list[str]:
        settings = self.settings
        return ["--device", settings.device, "--dtype", settings.dtype, "--threads", str(settings.threads)]

    @hookimpl(specname="werk_capabilities")
    def capabilities(self) -> dict[CapabilityId, CapabilityReport]:
        reports = super().capabilities()
        chat = "a chat instance: set the pooling option (mean or cls) for an embedding instance of an encoder"
        reports[CapabilityId.EMBEDDINGS] = CapabilityReport(CapabilityStatus.UNSUPPORTED, chat)
        reports[CapabilityId.RERANK] = CapabilityReport(
            CapabilityStatus.UNSUPPORTED, "the transformers backend serves no cross-encoder reranking"
        )
        return reports


def accepts(manifest: ModelManifest | None) -> bool:
    """A manifest pinned to this backend, or an unpinned Hugging Face checkpoint directory that
    is not an MLX conversion. An unpinned directory is also vLLM's: with both plugins installed
    the host refuses to guess and names both (docs/plugin-kit.md, "Which backend serves a model")."""
    if manifest is None:
        return False
    if manifest.backend is not None:
        return manifest.backend == BACKEND_ID
    directory = checkpoint_dir(manifest)
    return directory is not None and (safetensors_metadata(directory) or {}).get("format") != "mlx"


def create_adapter(
    config: HostConfig, manifest: ModelManifest | None
) -> TransformersAdapter | TransformersEmbeddingAdapter:
    """A chat instance, or an embedding instance when :func:`instance_pooling` names a pooling;
    its worker loaded."""
    if manifest is None:
        raise WerkError(ErrorCode.INVALID_REQUEST, "the transformers backend needs a model")
    directory = checkpoint_dir(manifest)
    if directory is None:
        raise WerkError(
            ErrorCode.INVALID_REQUEST,
            f"model {manifest.name} is not a Hugging Face checkpoint directory (config.json and *.safetensors)",
        )
    try:
        settings = parse_options(config.backend_options.get(BACKEND_ID, {}))
        cache_size()
    except ValueError as err:
        raise WerkError(ErrorCode.INVALID_REQUEST, f"transformers options: {err}") from err
    pooling = instance_pooling(settings, directory)
    if pooling is not None:
        return started(TransformersEmbeddingAdapter(config, manifest, settings, directory, pooling))
    return started(TransformersAdapter(config, manifest, settings, directory))

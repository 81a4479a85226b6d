"""What the plugin module declares about the vLLM backend without importing its adapter: the
ids, the capabilities its adapters report on and which models it accepts. ``werk serve`` loads
every plugin to choose a model's backend; the adapter (:mod:`werk_vllm.adapter`) is imported
only once a vLLM instance is created (docs/operations.md, "Start-up")."""

from __future__ import annotations

from werk_host.plugin import CapabilityId, ModelManifest
from werk_host.plugin.checkpoints import checkpoint_dir

BACKEND_ID = "vllm"
PLUGIN_NAME = "vllm"
CHAT_CAPABILITIES = (
    (CapabilityId.TOKEN_COUNT, "exact count from vLLM's /tokenize with the served chat template"),
    (CapabilityId.ADMISSION, "exact count from vLLM's /tokenize against its max_model_len"),
    (CapabilityId.CHAT_LIMITS, "max_model_len from vLLM's /v1/models, concurrency from --max-num-seqs"),
)
#: Every id :meth:`~werk_vllm.adapter.VllmAdapter.capabilities` reports on (declared on the
#: adapter factory).
REPORTED_CAPABILITIES = (
    CapabilityId.MODEL_RESIDENCY,
    CapabilityId.PREFIX_CACHE,
    *(cap_id for cap_id, _ in CHAT_CAPABILITIES),
    CapabilityId.REASONING,
    CapabilityId.EMBEDDINGS,
    CapabilityId.RERANK,
)


def accepts(manifest: ModelManifest | None) -> bool:
    """A manifest pinned to vLLM, or an unpinned Hugging Face checkpoint directory
    (:func:`~werk_host.plugin.checkpoints.checkpoint_dir`: ``config.json`` and
    ``*.safetensors`` side by side)."""
    if manifest is None:
        return False
    if manifest.backend is not None:
        return manifest.backend in (BACKEND_ID, PLUGIN_NAME)
    return checkpoint_dir(manifest) is not None

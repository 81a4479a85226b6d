"""werk_host.plugin: everything a backend plugin imports from the host (docs/plugin-kit.md).

A plugin under ``plugins/`` imports from this package and :mod:`werk_host.testing` only; a
test walks every plugin's imports and fails on any other host module. This module holds the
seam itself: the hook marker, the types that cross the plugin boundary, capability ids and the
protocol types hooks take and return, errors, the host configuration and model manifests.
The helpers every backend needs live in submodules, imported only by the plugins that use
them:

* :mod:`werk_host.plugin.process`: managed worker processes, run directories, executables.
* :mod:`werk_host.plugin.http`: the pooled HTTP client that relays a backend's answers.
* :mod:`werk_host.plugin.reasoning`: reasoning-profile helpers (the host's tier budgets).
* :mod:`werk_host.plugin.counting`: calibrating admission estimates from a backend's counts.
* :mod:`werk_host.plugin.cli`: text/``--json`` output for a plugin's ``werk`` commands.
* :mod:`werk_host.plugin.workers`: an engine's HTTP worker process (run directory, key, readiness).
* :mod:`werk_host.plugin.pool`: a bounded LRU of Werk-owned model workers, one per exact model.
* :mod:`werk_host.plugin.engines`: the adapter of an engine in a Werk-owned worker per exact model.
* :mod:`werk_host.plugin.engine_worker`: that worker's HTTP server (stdlib only, loaded by path).
* :mod:`werk_host.plugin.checkpoints`: checkpoint directories and model files as manifests.
* :mod:`werk_host.plugin.options`: validating a backend's ``werk.<name>`` request options.
* :mod:`werk_host.plugin.openai`: OpenAI answers and SSE chunks for in-process engines.
* :mod:`werk_host.plugin.tools`: forced tool calls as a JSON-schema-constrained generation.
"""

from __future__ import annotations

from werk_host import hookimpl
from werk_host.chat.seam import SessionSlot
from werk_host.config import BackendBounds, HostConfig, PersistenceDefaults, ServerLimits
from werk_host.deployments.durations import MAX_DURATION_S
from werk_host.digests import remembered_by_status, sha256_file
from werk_host.errors import REDACTED_MESSAGES, ErrorCode, WerkError
from werk_host.experts import ExpertObservation, ExpertPolicy
from werk_host.models import ModelFile, ModelManifest
from werk_host.paths import PrivateDirError, ensure_private_dir, user_cache_dir
from werk_host.protocol import (
    CapabilityId,
    CapabilityStatus,
    ChatLimits,
    ChatRequest,
    DeploymentPlan,
    EndpointKind,
    ExpertActionKind,
    ExpertActionRequest,
    ExpertActionResult,
    ExpertListQuery,
    ExpertPage,
    ExpertTier,
    ImageLimits,
    ImageMode,
    ImageRequest,
    ImageResult,
    MessagesInput,
    PersistenceMode,
    ReasoningProfile,
    ReasoningTierId,
    ReusePolicy,
    SpeechLimits,
    SpeechRequest,
    SpeechResult,
    TextInput,
    Tier,
    WorkerObservation,
)
from werk_host.protocol.embeddings import EmbeddingLimits, EmbeddingResult, EmbedInput, RerankResult
from werk_host.seam import (
    Adapter,
    AdapterFactory,
    CapabilityReport,
    DecodeOptions,
    DecodeOutput,
    DecodeWork,
    DoctorCheck,
    EmbeddingWork,
    ImageWork,
    InferenceResponse,
    JsonObject,
    MemoryEstimate,
    MemoryOperation,
    MoveOutput,
    MoveWork,
    PayloadOpener,
    PrefilledState,
    PrefillWork,
    PromptCache,
    PromptCacheLease,
    Pumpable,
    RerankWork,
    SavedPrompt,
    Snapshot,
    SpeechWork,
    StoredStateRef,
    client_disconnected,
)
from werk_host.store.records import checksum_text

__all__ = [
    "MAX_DURATION_S",
    "REDACTED_MESSAGES",
    "Adapter",
    "AdapterFactory",
    "BackendBounds",
    "CapabilityId",
    "CapabilityReport",
    "CapabilityStatus",
    "ChatLimits",
    "ChatRequest",
    "DecodeOptions",
    "DecodeOutput",
    "DecodeWork",
    "DeploymentPlan",
    "DoctorCheck",
    "EmbedInput",
    "EmbeddingLimits",
    "EmbeddingResult",
    "EmbeddingWork",
    "EndpointKind",
    "ErrorCode",
    "ExpertActionKind",
    "ExpertActionRequest",
    "ExpertActionResult",
    "ExpertListQuery",
    "ExpertObservation",
    "ExpertPage",
    "ExpertPolicy",
    "ExpertTier",
    "HostConfig",
    "ImageLimits",
    "ImageMode",
    "ImageRequest",
    "ImageResult",
    "ImageWork",
    "InferenceResponse",
    "JsonObject",
    "MemoryEstimate",
    "MemoryOperation",
    "MessagesInput",
    "ModelFile",
    "ModelManifest",
    "MoveOutput",
    "MoveWork",
    "PayloadOpener",
    "PersistenceDefaults",
    "PersistenceMode",
    "PrefillWork",
    "PrefilledState",
    "PrivateDirError",
    "ReasoningProfile",
    "RerankResult",
    "RerankWork",
    "ReasoningTierId",
    "ReusePolicy",
    "ServerLimits",
    "PromptCache",
    "Pumpable",
    "PromptCacheLease",
    "SavedPrompt",
    "SessionSlot",
    "Snapshot",
    "SpeechLimits",
    "SpeechRequest",
    "SpeechResult",
    "SpeechWork",
    "StoredStateRef",
    "TextInput",
    "Tier",
    "WerkError",
    "WorkerObservation",
    "checksum_text",
    "client_disconnected",
    "ensure_private_dir",
    "hookimpl",
    "remembered_by_status",
    "sha256_file",
    "user_cache_dir",
]

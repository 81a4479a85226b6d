"""Discovery DTOs: runtime info, limits and capabilities."""

from __future__ import annotations

from enum import StrEnum
from typing import Final

from pydantic import Field

from werk_host.protocol.base import (
    MAX_EXPERT_IDS_PER_OPERATION,
    MAX_HANDOFF_BYTES,
    MAX_PAGE_SIZE,
    MAX_REQUEST_BYTES,
    MAX_STATE_IDS_PER_OPERATION,
    MAX_TTL_SECONDS,
    CapabilityStatus,
    DataModel,
)
from werk_host.protocol.envelope import ProtocolVersion


class Limits(DataModel):
    max_page_size: int = MAX_PAGE_SIZE
    max_state_ids_per_operation: int = MAX_STATE_IDS_PER_OPERATION
    max_expert_ids_per_operation: int = MAX_EXPERT_IDS_PER_OPERATION
    max_request_bytes: int = MAX_REQUEST_BYTES
    max_handoff_bytes: int = MAX_HANDOFF_BYTES
    max_ttl_seconds: int = MAX_TTL_SECONDS


class RuntimeInfo(DataModel):
    service: str
    service_version: str
    protocol: ProtocolVersion
    active_backend: str | None
    limits: Limits = Field(default_factory=Limits)


class CapabilityId(StrEnum):
    """Every capability id of Werk Protocol 1.0 (docs/protocol.md, "Capability ids").

    A plugin reports statuses keyed by these members; an id outside this enum is a plugin
    defect that ``werk plugins`` flags and the conformance suite fails."""

    TOKEN_COUNT = "api.chat.token_count"
    ADMISSION = "api.chat.admission"
    CHAT_LIMITS = "api.chat.limits"
    REASONING = "api.chat.reasoning"
    OMLX_OPTIONS = "api.chat.omlx_options"
    TELEMETRY_HOST = "runtime.memory.telemetry.host"
    TELEMETRY_ACCELERATOR = "runtime.memory.telemetry.accelerator"
    RESERVATIONS = "runtime.memory.reservations"
    MODEL_RESIDENCY = "runtime.model_residency"
    PREFIX_CACHE = "runtime.state.prefix_cache"
    #: Werk's automatic prompt caches of ordinary requests (docs/prompt-cache.md); additive to
    #: the seed's ids, answered by the host from evidence
    PROMPT_CACHE = "runtime.state.prompt_cache"
    PERSISTENCE = "runtime.state.persistence"
    RESTORE = "runtime.state.restore"
    CROSS_RESTART = "runtime.state.restore.cross_restart"
    TIER_DISK = "runtime.state.tier.disk"
    TIER_RAM = "runtime.state.tier.ram"
    TIER_VRAM = "runtime.state.tier.vram"
    PD_PREFILL = "runtime.pd.prefill"
    PD_DECODE = "runtime.pd.decode"
    PD_HANDOFF = "runtime.pd.handoff"
    EXPERTS = "runtime.experts.residency"
    PLACEMENT = "runtime.placement"
    #: media (docs/media.md, "Capabilities"): additive to the seed's text ids
    IMAGE_TXT2IMG = "media.image.txt2img"
    IMAGE_IMG2IMG = "media.image.img2img"
    SPEECH_SYNTHESIS = "media.speech.synthesis"
    SPEECH_INSTRUCTIONS = "media.speech.instructions"
    SPEECH_STREAMING = "media.speech.streaming"
    #: embeddings and reranking (docs/embeddings.md): additive to the seed's ids
    EMBEDDINGS = "api.embeddings"
    RERANK = "api.rerank"

    @classmethod
    def tier(cls, tier: str) -> CapabilityId:
        """The ``runtime.state.tier.<tier>`` id of a state tier (``disk``, ``ram``, ``vram``)."""
        return cls(f"runtime.state.tier.{tier}")


class Capability(DataModel):
    id: CapabilityId
    status: CapabilityStatus
    detail: str
    operations: list[str]


#: Every capability id with the operations each entry scopes (docs/protocol.md, "Capability ids").
CAPABILITY_OPERATIONS: Final[dict[CapabilityId, tuple[str, ...]]] = {
    CapabilityId.TOKEN_COUNT: ("count_tokens",),
    CapabilityId.ADMISSION: ("admission",),
    CapabilityId.CHAT_LIMITS: ("limits",),
    CapabilityId.REASONING: ("profile", "tiers"),
    CapabilityId.OMLX_OPTIONS: ("thinking", "expert_cache_mb", "ngram_cache_mb"),
    CapabilityId.TELEMETRY_HOST: ("sample",),
    CapabilityId.TELEMETRY_ACCELERATOR: ("sample",),
    CapabilityId.RESERVATIONS: ("reserve", "release"),
    CapabilityId.MODEL_RESIDENCY: ("automatic_reuse",),
    CapabilityId.PREFIX_CACHE: ("automatic_reuse",),
    CapabilityId.PROMPT_CACHE: ("automatic_reuse",),
    CapabilityId.PERSISTENCE: ("snapshot", "list", "prune"),
    CapabilityId.RESTORE: ("restore",),
    CapabilityId.CROSS_RESTART: ("restore",),
    CapabilityId.TIER_DISK: ("promote", "demote", "evict"),
    CapabilityId.TIER_RAM: ("promote", "demote", "evict"),
    CapabilityId.TIER_VRAM: ("promote", "demote", "evict"),
    CapabilityId.PD_PREFILL: ("prefill",),
    CapabilityId.PD_DECODE: ("decode",),
    CapabilityId.PD_HANDOFF: ("issue", "consume"),
    CapabilityId.EXPERTS: ("list", "prefetch", "pin", "unpin", "evict"),
    CapabilityId.PLACEMENT: ("plan",),
    CapabilityId.IMAGE_TXT2IMG: ("generate", "progress", "cancel"),
    CapabilityId.IMAGE_IMG2IMG: ("generate", "progress", "cancel"),
    CapabilityId.SPEECH_SYNTHESIS: ("synthesize", "voices", "languages", "formats"),
    CapabilityId.SPEECH_INSTRUCTIONS: ("synthesize",),
    CapabilityId.SPEECH_STREAMING: ("stream",),
    CapabilityId.EMBEDDINGS: ("embed", "dimensions", "pooling", "normalized", "max_input_tokens", "batch"),
    CapabilityId.RERANK: ("rerank",),
}

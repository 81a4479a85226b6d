"""Discovery DTOs: runtime info, limits and capabilities."""

from __future__ import annotations

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


class Capability(DataModel):
    id: str
    status: CapabilityStatus
    detail: str
    operations: list[str]


#: Every capability id named by the two seeds, with the operations each entry scopes.
CAPABILITY_OPERATIONS: Final[dict[str, tuple[str, ...]]] = {
    "api.chat.token_count": ("count_tokens",),
    "api.chat.admission": ("admission",),
    "api.chat.limits": ("limits",),
    "api.chat.reasoning": ("profile", "tiers"),
    "api.chat.omlx_options": ("thinking", "expert_cache_mb", "ngram_cache_mb"),
    "runtime.memory.telemetry.host": ("sample",),
    "runtime.memory.telemetry.accelerator": ("sample",),
    "runtime.memory.reservations": ("reserve", "release"),
    "runtime.model_residency": ("automatic_reuse",),
    "runtime.state.prefix_cache": ("automatic_reuse",),
    "runtime.state.persistence": ("snapshot", "list", "prune"),
    "runtime.state.restore": ("restore",),
    "runtime.state.restore.cross_restart": ("restore",),
    "runtime.state.tier.disk": ("promote", "demote", "evict"),
    "runtime.state.tier.ram": ("promote", "demote", "evict"),
    "runtime.state.tier.vram": ("promote", "demote", "evict"),
    "runtime.pd.prefill": ("prefill",),
    "runtime.pd.decode": ("decode",),
    "runtime.pd.handoff": ("issue", "consume"),
    "runtime.experts.residency": ("list", "prefetch", "pin", "unpin", "evict"),
    "runtime.placement": ("plan",),
}

"""MoE expert-residency DTOs."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Self

from pydantic import ConfigDict, Field, model_validator

from werk_host.protocol.base import (
    MAX_EXPERT_IDS_PER_OPERATION,
    MAX_PAGE_SIZE,
    DataModel,
    JsonBool,
    StrictModel,
    Tier,
    check_target_tier,
    target_tier_schema,
)


class ExpertTier(StrEnum):
    VRAM = "vram"
    RAM = "ram"
    EXTERNAL = "external"


class ExpertSummary(DataModel):
    id: str
    model_id: str
    tier: ExpertTier
    bytes: int | None
    hotness: float
    pinned: bool
    last_used_unix_ms: int | None = None


class ExpertPage(DataModel):
    experts: list[ExpertSummary]
    next_cursor: str | None


class ExpertListQuery(StrictModel):
    model_id: str | None = Field(None, min_length=1, max_length=256)
    tier: ExpertTier | None = None
    limit: int = Field(MAX_PAGE_SIZE, ge=1, le=MAX_PAGE_SIZE)
    cursor: str | None = Field(None, min_length=1, max_length=512)
    allow_experimental: JsonBool = False


class ExpertActionKind(StrEnum):
    PREFETCH = "prefetch"
    PIN = "pin"
    UNPIN = "unpin"
    EVICT = "evict"


#: ``target_tier`` per expert action (see :func:`werk_host.protocol.base.check_target_tier`).
EXPERT_ACTION_TARGETS: dict[ExpertActionKind, tuple[Tier, ...] | None] = {
    ExpertActionKind.PREFETCH: (Tier.VRAM, Tier.RAM),
    ExpertActionKind.PIN: None,
    ExpertActionKind.UNPIN: None,
    ExpertActionKind.EVICT: None,
}

ExpertId = Annotated[str, Field(min_length=1, max_length=256)]


class ExpertActionRequest(StrictModel):
    model_config = ConfigDict(json_schema_extra=target_tier_schema(EXPERT_ACTION_TARGETS))

    model_id: str = Field(min_length=1, max_length=256)
    expert_ids: list[ExpertId] = Field(
        min_length=1, max_length=MAX_EXPERT_IDS_PER_OPERATION, json_schema_extra={"uniqueItems": True}
    )
    action: ExpertActionKind
    target_tier: Tier | None = None
    dry_run: JsonBool = False
    allow_experimental: JsonBool = False

    @model_validator(mode="after")
    def _target_rules(self) -> Self:
        if len(set(self.expert_ids)) != len(self.expert_ids):
            raise ValueError("expert_ids must be unique")
        check_target_tier(EXPERT_ACTION_TARGETS, self.action, self.target_tier)
        return self


class ExpertActionResult(DataModel):
    experts: list[ExpertSummary]
    changed: bool
    dry_run: bool

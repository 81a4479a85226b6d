"""MoE expert-residency DTOs."""

from __future__ import annotations

from enum import StrEnum
from typing import Self

from pydantic import Field, model_validator

from werk_host.protocol.base import (
    MAX_EXPERT_IDS_PER_OPERATION,
    MAX_PAGE_SIZE,
    DataModel,
    StrictModel,
    Tier,
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
    allow_experimental: bool = False


class ExpertActionKind(StrEnum):
    PREFETCH = "prefetch"
    PIN = "pin"
    UNPIN = "unpin"
    EVICT = "evict"


class ExpertActionRequest(StrictModel):
    model_id: str = Field(min_length=1, max_length=256)
    expert_ids: list[str] = Field(min_length=1, max_length=MAX_EXPERT_IDS_PER_OPERATION)
    action: ExpertActionKind
    target_tier: Tier | None = None
    dry_run: bool = False
    allow_experimental: bool = False

    @model_validator(mode="after")
    def _target_rules(self) -> Self:
        if any(not e or len(e) > 256 for e in self.expert_ids):
            raise ValueError("expert ids must be 1..256 characters")
        if len(set(self.expert_ids)) != len(self.expert_ids):
            raise ValueError("expert_ids must be unique")
        if self.action is ExpertActionKind.PREFETCH:
            if self.target_tier not in (Tier.VRAM, Tier.RAM):
                raise ValueError("prefetch requires target_tier vram or ram")
        elif self.target_tier is not None:
            raise ValueError(f"target_tier must be omitted for {self.action.value}")
        return self


class ExpertActionResult(DataModel):
    experts: list[ExpertSummary]
    changed: bool
    dry_run: bool

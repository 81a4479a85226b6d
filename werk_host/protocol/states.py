"""Named runtime-state DTOs: summaries, actions and prune selectors."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal, Self

from pydantic import ConfigDict, Field, WithJsonSchema, field_validator, model_validator

from werk_host.protocol.base import (
    MAX_PAGE_SIZE,
    MAX_STATE_IDS_PER_OPERATION,
    TIER_ORDER,
    DataModel,
    JsonBool,
    NonNegativeJsonInt,
    StrictModel,
    Tier,
    check_target_tier,
    present_schema,
    target_tier_schema,
)

StateId = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^st_[A-Za-z0-9_-]+$")]


class StateStatus(StrEnum):
    READY = "ready"
    LOADING = "loading"
    MOVING = "moving"
    UNAVAILABLE = "unavailable"
    QUARANTINED = "quarantined"


class StateSummary(DataModel):
    id: str
    model_id: str
    backend: str
    tier: Tier
    status: StateStatus
    bytes: int | None
    created_unix_ms: int
    last_accessed_unix_ms: int
    expires_unix_ms: int | None
    pinned: bool
    reusable: bool


class StatePage(DataModel):
    states: list[StateSummary]
    next_cursor: str | None


class StateListQuery(StrictModel):
    model_id: str | None = Field(None, min_length=1, max_length=256)
    tier: Tier | None = None
    limit: int = Field(MAX_PAGE_SIZE, ge=1, le=MAX_PAGE_SIZE)
    cursor: str | None = Field(None, min_length=1, max_length=512)


class StateActionKind(StrEnum):
    PIN = "pin"
    UNPIN = "unpin"
    PROMOTE = "promote"
    DEMOTE = "demote"
    EVICT = "evict"


#: ``target_tier`` per state action: the tiers it may name, or ``None`` where it must be omitted.
#: The one source of both the validation below and the OpenAPI document's ``if``/``then`` rules.
STATE_ACTION_TARGETS: dict[StateActionKind, tuple[Tier, ...] | None] = {
    StateActionKind.PIN: None,
    StateActionKind.UNPIN: None,
    StateActionKind.EVICT: None,
    StateActionKind.PROMOTE: (Tier.VRAM, Tier.RAM, Tier.DISK),  # external is never a local target
    StateActionKind.DEMOTE: (Tier.VRAM, Tier.RAM, Tier.DISK),
}


class StateActionRequest(StrictModel):
    model_config = ConfigDict(json_schema_extra=target_tier_schema(STATE_ACTION_TARGETS))

    action: StateActionKind
    target_tier: Tier | None = None
    dry_run: JsonBool = False
    allow_experimental: JsonBool = False

    @model_validator(mode="after")
    def _target_rules(self) -> Self:
        check_target_tier(STATE_ACTION_TARGETS, self.action, self.target_tier)
        return self


def tier_moves_in_direction(current: Tier, target: Tier, action: StateActionKind) -> bool:
    """Whether ``target`` is strictly faster (promote) or slower (demote) than ``current``."""
    here, there = TIER_ORDER.index(current), TIER_ORDER.index(target)
    return there < here if action is StateActionKind.PROMOTE else there > here


class StateActionResult(DataModel):
    state: StateSummary
    changed: bool
    dry_run: bool


class IdsSelector(StrictModel):
    kind: Literal["ids"]
    ids: list[StateId] = Field(
        min_length=1, max_length=MAX_STATE_IDS_PER_OPERATION, json_schema_extra={"uniqueItems": True}
    )

    @model_validator(mode="after")
    def _unique(self) -> Self:
        if len(set(self.ids)) != len(self.ids):
            raise ValueError("ids must be unique")
        return self


class FilterSelector(StrictModel):
    model_config = ConfigDict(
        json_schema_extra={"anyOf": [present_schema(n) for n in ("model_id", "tier", "older_than_unix_ms")]}
    )

    kind: Literal["filter"]
    model_id: str | None = Field(None, min_length=1, max_length=256)
    tier: Tier | None = None
    older_than_unix_ms: NonNegativeJsonInt | None = None

    @model_validator(mode="after")
    def _constrained(self) -> Self:
        if self.model_id is None and self.tier is None and self.older_than_unix_ms is None:
            raise ValueError("a filter selector needs at least one non-null restriction")
        return self


class AllSelector(StrictModel):
    kind: Literal["all"]
    confirm: Annotated[JsonBool, WithJsonSchema({"const": True, "description": "must be true"})]

    @field_validator("confirm")
    @classmethod
    def _confirmed(cls, value: bool) -> bool:
        if value is not True:
            raise ValueError("selector 'all' requires confirm: true")
        return value


PruneSelector = Annotated[IdsSelector | FilterSelector | AllSelector, Field(discriminator="kind")]


class PruneRequest(StrictModel):
    selector: PruneSelector
    dry_run: JsonBool = True


class PruneResult(DataModel):
    matched: int
    removed: int
    bytes: int | None
    dry_run: bool

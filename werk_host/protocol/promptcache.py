"""Prompt-cache entry DTOs: one key's automatic prompt caches, listed, pinned and pruned.

An entry is named ``<instance>/<entry>``: the instance's prompt-cache store and the entry's id in
it (docs/prompt-cache.md, "Routes"). Only the requesting key's entries are ever listed or touched.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal, Self

from pydantic import ConfigDict, Field, model_validator

from werk_host.protocol.base import (
    MAX_STATE_IDS_PER_OPERATION,
    DataModel,
    JsonBool,
    NonNegativeJsonInt,
    StrictModel,
    present_schema,
)
from werk_host.protocol.states import AllSelector, IdsSelector

#: An instance's prompt-cache store name (the instance id, or ``i-`` and a digest of it).
CacheStoreName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$")]
#: ``<instance>/<entry>``.
PromptCacheEntryId = Annotated[
    str, Field(min_length=4, max_length=200, pattern=r"^[A-Za-z0-9._-]{1,64}/st_[A-Za-z0-9_-]+$")
]
MAX_PROMPT_CACHE_LIST = 500


class PromptCacheEntry(DataModel):
    id: str
    instance: str
    prompt_tokens: int | None
    bytes: int | None
    created_unix_ms: int
    last_accessed_unix_ms: int
    pinned: bool
    #: whether the instance's running backend would restore it now (its configuration is the
    #: entry's); ``null`` while no process of that instance runs
    reusable: bool | None


class PromptCacheList(DataModel):
    entries: list[PromptCacheEntry]
    #: more entries than ``limit`` exist (the most recently used are listed)
    truncated: bool


class PromptCacheListQuery(StrictModel):
    instance: CacheStoreName | None = None
    limit: int = Field(100, ge=1, le=MAX_PROMPT_CACHE_LIST)


class PromptCacheActionKind(StrEnum):
    PIN = "pin"
    UNPIN = "unpin"
    EVICT = "evict"


class PromptCacheActionRequest(StrictModel):
    action: PromptCacheActionKind
    dry_run: JsonBool = False


class PromptCacheActionResult(DataModel):
    entry: PromptCacheEntry
    changed: bool
    dry_run: bool


class PromptCacheIdsSelector(IdsSelector):
    """Explicit prompt-cache entry ids: 1 to 100, unique (as for states)."""

    ids: list[PromptCacheEntryId] = Field(
        min_length=1, max_length=MAX_STATE_IDS_PER_OPERATION, json_schema_extra={"uniqueItems": True}
    )


class PromptCacheFilterSelector(StrictModel):
    model_config = ConfigDict(
        json_schema_extra={"anyOf": [present_schema(n) for n in ("instance", "older_than_unix_ms")]}
    )

    kind: Literal["filter"]
    instance: CacheStoreName | None = None
    older_than_unix_ms: NonNegativeJsonInt | None = None

    @model_validator(mode="after")
    def _constrained(self) -> Self:
        if self.instance is None and self.older_than_unix_ms is None:
            raise ValueError("a filter selector needs at least one non-null restriction")
        return self


PromptCacheSelector = Annotated[
    PromptCacheIdsSelector | PromptCacheFilterSelector | AllSelector, Field(discriminator="kind")
]


class PromptCachePruneRequest(StrictModel):
    selector: PromptCacheSelector
    dry_run: JsonBool = True

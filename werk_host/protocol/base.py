"""Shared pydantic bases, enums and limits of Werk Protocol 1.0."""

from __future__ import annotations

from enum import StrEnum
from typing import Final

from pydantic import BaseModel, ConfigDict

PROTOCOL_MAJOR: Final = 1
PROTOCOL_MINOR: Final = 0
PROTOCOL_VERSION: Final = f"{PROTOCOL_MAJOR}.{PROTOCOL_MINOR}"

MAX_PAGE_SIZE: Final = 100
MAX_STATE_IDS_PER_OPERATION: Final = 100
MAX_EXPERT_IDS_PER_OPERATION: Final = 256
MAX_REQUEST_BYTES: Final = 1 << 20
MAX_HANDOFF_BYTES: Final = 4096
MAX_TTL_SECONDS: Final = 2_592_000
MAX_INPUT_TEXT_BYTES: Final = 512 * 1024
MAX_MESSAGES: Final = 256
MAX_DECODE_TOKENS: Final = 32_768
MAX_STOP_STRINGS: Final = 16
MAX_STOP_BYTES: Final = 1024
MAX_COMPLETION_TEXT_BYTES: Final = 1 << 20
DEFAULT_OUTPUT_TOKENS: Final = 256


class StrictModel(BaseModel):
    """Request DTO that rejects unknown fields (mutation, prefill and decode requests)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class DataModel(BaseModel):
    """Response DTO: exactly the documented fields, nothing else."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class CapabilityStatus(StrEnum):
    SUPPORTED = "supported"
    UNSUPPORTED = "unsupported"
    UNAVAILABLE = "unavailable"
    EXPERIMENTAL = "experimental"
    EXTERNALLY_MANAGED = "externally_managed"
    METADATA_ONLY = "metadata_only"


class Tier(StrEnum):
    VRAM = "vram"
    RAM = "ram"
    DISK = "disk"
    EXTERNAL = "external"


#: Order of state tiers from fastest to slowest; promote moves left, demote right.
TIER_ORDER: Final = (Tier.VRAM, Tier.RAM, Tier.DISK, Tier.EXTERNAL)


class Pressure(StrEnum):
    NORMAL = "normal"
    SOFT = "soft"
    HARD = "hard"
    EMERGENCY = "emergency"
    UNKNOWN = "unknown"


class Topology(StrEnum):
    DISCRETE = "discrete"
    UNIFIED = "unified"
    UNKNOWN = "unknown"

__all__ = [
    "PROTOCOL_MAJOR", "PROTOCOL_MINOR", "PROTOCOL_VERSION", "MAX_PAGE_SIZE", "MAX_STATE_IDS_PER_OPERATION",
    "MAX_EXPERT_IDS_PER_OPERATION", "MAX_REQUEST_BYTES", "MAX_HANDOFF_BYTES", "MAX_TTL_SECONDS",
    "MAX_INPUT_TEXT_BYTES", "MAX_MESSAGES", "MAX_DECODE_TOKENS", "MAX_STOP_STRINGS", "MAX_STOP_BYTES",
    "MAX_COMPLETION_TEXT_BYTES", "DEFAULT_OUTPUT_TOKENS", "StrictModel", "DataModel", "CapabilityStatus",
    "Tier", "TIER_ORDER", "Pressure", "Topology",
]

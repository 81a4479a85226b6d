"""Shared pydantic bases, enums and limits of Werk Protocol 1.0."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Annotated, Any, Final, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, JsonValue, Strict, StrictBool, StrictInt

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


#: A request boolean: only JSON ``true``/``false`` (never ``0``, ``"no"`` or ``"false"``).
JsonBool = StrictBool


def integral_number(value: object) -> object:
    """JSON Schema counts ``5.0`` as an integer; so do we. Everything else passes unchanged."""
    if type(value) is float and value.is_integer():
        return int(value)
    return value


#: A request integer: a JSON number without a fraction (``5`` or ``5.0``; never ``true`` or ``"5"``).
#: Bounds go *before* the validator (``Annotated[StrictInt, Field(ge=1), BeforeValidator(...)]``,
#: as the aliases below) so that the OpenAPI document states them as ``minimum``/``maximum``.
JsonInt = Annotated[StrictInt, BeforeValidator(integral_number)]
PositiveJsonInt = Annotated[StrictInt, Field(ge=1), BeforeValidator(integral_number)]
NonNegativeJsonInt = Annotated[StrictInt, Field(ge=0), BeforeValidator(integral_number)]
#: A request number: a JSON integer or fraction (never a boolean or a string).
JsonFloat = Annotated[float, Strict()]


class StrictModel(BaseModel):
    """Request DTO that rejects unknown fields (mutation, prefill and decode requests)."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


class DataModel(BaseModel):
    """Response DTO: exactly the documented fields, nothing else."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


class CapabilityStatus(StrEnum):
    SUPPORTED = "supported"
    UNSUPPORTED = "unsupported"
    UNAVAILABLE = "unavailable"
    EXPERIMENTAL = "experimental"
    EXTERNALLY_MANAGED = "externally_managed"
    METADATA_ONLY = "metadata_only"


K = TypeVar("K", bound=StrEnum)


class Tier(StrEnum):
    VRAM = "vram"
    RAM = "ram"
    DISK = "disk"
    EXTERNAL = "external"


def present_schema(*names: str, **consts: JsonValue) -> JsonValue:
    """JSON Schema: every field in ``names`` is present and not null, each of ``consts`` equals its value."""
    properties: dict[str, JsonValue] = {name: {"not": {"type": "null"}} for name in names}
    properties.update({name: {"const": value} for name, value in consts.items()})
    return {"required": [*names, *consts], "properties": properties}


def check_target_tier(rules: Mapping[K, tuple[StrEnum, ...] | None], action: K, target: StrEnum | None) -> None:
    """Apply one ``target_tier`` rule table: ``None`` = must be omitted, else one of the listed tiers."""
    allowed = rules[action]
    if allowed is None:
        if target is not None:
            raise ValueError(f"target_tier must be omitted for {action.value}")
    elif target is None:
        raise ValueError(f"target_tier is required for {action.value}")
    elif target not in allowed:
        raise ValueError(f"target_tier for {action.value} must be one of {', '.join(t.value for t in allowed)}")


def target_tier_schema(rules: Mapping[K, tuple[StrEnum, ...] | None]) -> dict[str, Any]:
    """The same rule table as JSON Schema ``if``/``then`` clauses for the OpenAPI document."""
    groups: dict[tuple[str, ...] | None, list[str]] = {}
    for action, allowed in rules.items():
        groups.setdefault(None if allowed is None else tuple(t.value for t in allowed), []).append(action.value)
    clauses: list[dict[str, Any]] = []
    for allowed_values, actions in groups.items():
        when = {"required": ["action"], "properties": {"action": {"enum": actions}}}
        if allowed_values is None:
            then: dict[str, Any] = {"properties": {"target_tier": {"type": "null"}}}
        else:
            then = {"required": ["target_tier"], "properties": {"target_tier": {"enum": list(allowed_values)}}}
        clauses.append({"if": when, "then": then})
    return {"allOf": clauses}


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
    "PROTOCOL_MAJOR",
    "PROTOCOL_MINOR",
    "PROTOCOL_VERSION",
    "MAX_PAGE_SIZE",
    "MAX_STATE_IDS_PER_OPERATION",
    "MAX_EXPERT_IDS_PER_OPERATION",
    "MAX_REQUEST_BYTES",
    "MAX_HANDOFF_BYTES",
    "MAX_TTL_SECONDS",
    "MAX_INPUT_TEXT_BYTES",
    "MAX_MESSAGES",
    "MAX_DECODE_TOKENS",
    "MAX_STOP_STRINGS",
    "MAX_STOP_BYTES",
    "MAX_COMPLETION_TEXT_BYTES",
    "DEFAULT_OUTPUT_TOKENS",
    "JsonBool",
    "JsonInt",
    "integral_number",
    "PositiveJsonInt",
    "NonNegativeJsonInt",
    "JsonFloat",
    "StrictModel",
    "DataModel",
    "CapabilityStatus",
    "Tier",
    "TIER_ORDER",
    "check_target_tier",
    "target_tier_schema",
    "present_schema",
    "Pressure",
    "Topology",
]

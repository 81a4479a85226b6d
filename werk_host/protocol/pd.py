"""Split prefill/decode DTOs: inputs, persistence policy, prefill and decode."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal, Self

from pydantic import BeforeValidator, Field, PlainSerializer, SecretStr, StrictInt, field_validator, model_validator

from werk_host.protocol.base import (
    MAX_DECODE_TOKENS,
    MAX_HANDOFF_BYTES,
    MAX_INPUT_TEXT_BYTES,
    MAX_MESSAGES,
    MAX_STOP_BYTES,
    MAX_STOP_STRINGS,
    MAX_TTL_SECONDS,
    DataModel,
    JsonBool,
    JsonFloat,
    JsonInt,
    StrictModel,
    Tier,
    integral_number,
)


class PersistenceMode(StrEnum):
    EPHEMERAL = "ephemeral"
    MEMORY = "memory"
    DISK = "disk"
    AUTO = "auto"


class ReusePolicy(StrEnum):
    DISABLED = "disabled"
    PREFER = "prefer"
    REQUIRED = "required"


TtlSeconds = Annotated[StrictInt, Field(ge=1, le=MAX_TTL_SECONDS), BeforeValidator(integral_number)]
Seed = Annotated[StrictInt, Field(ge=-(2**63), le=2**63 - 1), BeforeValidator(integral_number)]


class Policy(StrictModel):
    """Persistence policy; a present ``policy`` owns every inner field (defaults below)."""

    mode: PersistenceMode = PersistenceMode.AUTO
    reuse: ReusePolicy = ReusePolicy.PREFER
    ttl_seconds: TtlSeconds | None = None
    pin: JsonBool = False


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


class TextInput(StrictModel):
    type: Literal["text"]
    text: str = Field(min_length=1, max_length=MAX_INPUT_TEXT_BYTES, description="at most 512 KiB of UTF-8")

    @field_validator("text")
    @classmethod
    def _bounded(cls, value: str) -> str:
        if _utf8_len(value) > MAX_INPUT_TEXT_BYTES:
            raise ValueError("text exceeds 512 KiB")
        return value


class Role(StrEnum):
    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


class Message(StrictModel):
    role: Role
    content: str


class MessagesInput(StrictModel):
    type: Literal["messages"]
    messages: list[Message] = Field(min_length=1, max_length=MAX_MESSAGES)

    @model_validator(mode="after")
    def _bounded(self) -> Self:
        if sum(_utf8_len(m.content) for m in self.messages) > MAX_INPUT_TEXT_BYTES:
            raise ValueError("total message content exceeds 512 KiB")
        return self


#: A bearer handoff: hidden from ``repr`` and logs, serialized as its plain value on the wire.
HandoffSecret = Annotated[SecretStr, PlainSerializer(lambda s: s.get_secret_value(), return_type=str)]

PrefillInput = Annotated[TextInput | MessagesInput, Field(discriminator="type")]


class PrefillRequest(StrictModel):
    """``policy`` and ``allow_experimental`` stay ``None`` when absent so server defaults can apply."""

    model_id: str = Field(min_length=1, max_length=256)
    input: PrefillInput
    policy: Policy | None = None
    allow_experimental: JsonBool | None = None


class PrefillResult(DataModel):
    handoff: HandoffSecret
    state_id: str | None
    prompt_tokens: int
    reused: bool
    tier: Tier | None
    expires_unix_ms: int | None


class DecodeRequest(StrictModel):
    handoff: HandoffSecret = Field(min_length=1, max_length=MAX_HANDOFF_BYTES)
    max_tokens: JsonInt = Field(256, ge=1, le=MAX_DECODE_TOKENS)
    temperature: JsonFloat | None = Field(None, ge=0, le=2)
    top_p: JsonFloat | None = Field(None, gt=0, le=1)
    seed: Seed | None = None
    stop: list[Annotated[str, Field(min_length=1, max_length=MAX_STOP_BYTES)]] | None = Field(
        None, max_length=MAX_STOP_STRINGS
    )
    allow_experimental: JsonBool = False

    @field_validator("handoff")
    @classmethod
    def _handoff_bounded(cls, value: SecretStr) -> SecretStr:
        if _utf8_len(value.get_secret_value()) > MAX_HANDOFF_BYTES:
            raise ValueError("handoff exceeds max_handoff_bytes")
        return value

    @field_validator("stop")
    @classmethod
    def _stop_bounded(cls, value: list[str] | None) -> list[str] | None:
        for item in value or []:
            if _utf8_len(item) > MAX_STOP_BYTES:
                raise ValueError("a stop string exceeds 1024 bytes")
        return value


class FinishReason(StrEnum):
    STOP = "stop"
    LENGTH = "length"


class DecodeResult(DataModel):
    text: str
    handoff: HandoffSecret | None
    completion_tokens: int
    finish_reason: FinishReason

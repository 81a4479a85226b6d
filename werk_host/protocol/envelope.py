"""The response envelope shared by every ``/werk/v1`` route."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from werk_host.errors import ErrorCode
from werk_host.protocol.base import PROTOCOL_MAJOR, PROTOCOL_MINOR, DataModel


class ProtocolVersion(DataModel):
    major: int = Field(PROTOCOL_MAJOR, ge=0)
    minor: int = Field(PROTOCOL_MINOR, ge=0)


class ErrorBody(DataModel):
    code: ErrorCode
    message: str
    retryable: bool
    details: dict[str, Any] | None = None


class SuccessEnvelope(DataModel):
    protocol: ProtocolVersion
    request_id: str
    data: Any


class ErrorEnvelope(DataModel):
    protocol: ProtocolVersion
    request_id: str
    error: ErrorBody

"""The response envelope shared by every ``/werk/v1`` route (docs/protocol.md, "Envelopes").

These models are the one source of the envelope: the HTTP layer renders every response
through :func:`success_json`/:func:`error_json` and the OpenAPI document derives the
envelope schema from :class:`SuccessEnvelope`."""

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
    data: Any  # one route's response DTO (or a list of them); the OpenAPI document names it per route


class ErrorEnvelope(DataModel):
    protocol: ProtocolVersion
    request_id: str
    error: ErrorBody


def success_json(request_id: str, data: object) -> str:
    """The compact JSON text of a success envelope around ``data``."""
    return SuccessEnvelope(protocol=ProtocolVersion(), request_id=request_id, data=data).model_dump_json()


def error_json(request_id: str, error: ErrorBody) -> str:
    """The compact JSON text of an error envelope (``details`` left out when there are none)."""
    return ErrorEnvelope(protocol=ProtocolVersion(), request_id=request_id, error=error).model_dump_json(
        exclude_none=True
    )

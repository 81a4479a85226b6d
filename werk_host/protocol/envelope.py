"""The response envelope shared by every ``/werk/v1`` route (docs/protocol.md, "Envelopes").

These models are the one source of the envelope: the HTTP layer renders every response
through :func:`success_json`/:func:`error_json` and the OpenAPI document derives the
envelope schema from :class:`SuccessEnvelope`. :func:`success_json` writes a success envelope's
text directly, in the model's field order, so that an already serialized ``data`` can be reused
(:func:`success_json_text`); tests hold it equal to the model's own serialization."""

from __future__ import annotations

from typing import Any, Final

from pydantic import Field
from pydantic_core import to_json

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


def data_json(data: object) -> str:
    """The compact JSON text of one response's ``data`` member, as :class:`SuccessEnvelope`
    serializes it."""
    return to_json(data, by_alias=False).decode()


#: ``{"major":1,"minor":0}``: every success envelope's ``protocol`` member.
_PROTOCOL_JSON: Final = ProtocolVersion().model_dump_json()


def success_json(request_id: str, data: object) -> str:
    """The compact JSON text of a success envelope around ``data``."""
    return success_json_text(request_id, data_json(data))


def success_json_text(request_id: str, data_text: str) -> str:
    """:func:`success_json` around ``data`` already serialized by :func:`data_json`: the same
    text ``SuccessEnvelope(...).model_dump_json()`` gives, in its field order (a test holds the
    two equal), without serializing ``data`` again."""
    return f'{{"protocol":{_PROTOCOL_JSON},"request_id":{data_json(request_id)},"data":{data_text}}}'


def error_json(request_id: str, error: ErrorBody) -> str:
    """The compact JSON text of an error envelope (``details`` left out when there are none)."""
    return ErrorEnvelope(protocol=ProtocolVersion(), request_id=request_id, error=error).model_dump_json(
        exclude_none=True
    )

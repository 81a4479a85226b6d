"""Request parsing and envelope rendering shared by every protocol resource."""

from __future__ import annotations

from typing import Any, TypeVar

import falcon
from pydantic import BaseModel, ValidationError

from werk_host.errors import ErrorCode, WerkError, validation_message
from werk_host.http.jsonbody import decode_json_body
from werk_host.protocol.envelope import success_json, success_json_text
from werk_host.service.cache import Shared
from werk_host.service.principals import Principal
from werk_host.service.scope import RequestScope

M = TypeVar("M", bound=BaseModel)


def json_body(req: falcon.Request) -> Any:
    """The request's JSON document, strictly decoded (:mod:`werk_host.http.jsonbody`)."""
    raw: bytes = req.context.body
    return decode_json_body(raw)


def object_body(req: falcon.Request) -> dict[str, Any]:
    """The request's JSON document, which must be an object (``invalid_request`` otherwise)."""
    payload = json_body(req)
    if not isinstance(payload, dict):
        raise WerkError(ErrorCode.INVALID_REQUEST, "the request body must be a JSON object")
    return payload


def parse_body(req: falcon.Request, model: type[M]) -> M:
    payload = object_body(req)
    try:
        return model.model_validate(payload)
    except ValidationError as err:
        raise WerkError(ErrorCode.INVALID_REQUEST, validation_message(err)) from err


def parse_query(req: falcon.Request, model: type[M], *, booleans: tuple[str, ...] = ()) -> M:
    params: dict[str, Any] = {}
    for name, value in req.params.items():
        if isinstance(value, list):
            raise WerkError(ErrorCode.INVALID_REQUEST, f"query parameter {name} given more than once")
        if name in booleans:
            if value not in ("true", "false"):
                raise WerkError(ErrorCode.INVALID_REQUEST, f"{name} must be true or false")
            params[name] = value == "true"
        else:
            params[name] = value
    try:
        return model.model_validate(params)
    except ValidationError as err:
        raise WerkError(ErrorCode.INVALID_REQUEST, validation_message(err)) from err


def principal(req: falcon.Request) -> Principal:
    found: Principal = req.context.principal
    return found


def scope(req: falcon.Request) -> RequestScope:
    """The request's principal and instance, resolved once by the request middleware."""
    found: RequestScope = req.context.scope
    return found


def render_data(req: falcon.Request, resp: falcon.Response, data: Any, status: int = 200) -> None:
    resp.status = status
    resp.text = success_json(req.context.request_id, data)


def render_shared(req: falcon.Request, resp: falcon.Response, shared: Shared[Any]) -> None:
    """:func:`render_data` for a result the service keeps in its cache layer (the capability
    listing, a page of states; :mod:`werk_host.service.cache`): its JSON text is made once."""
    resp.status = 200
    resp.text = success_json_text(req.context.request_id, shared.text)

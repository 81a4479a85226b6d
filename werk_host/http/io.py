"""Request parsing and envelope rendering shared by every protocol resource."""

from __future__ import annotations

import threading
from typing import Any, TypeVar

import falcon
from pydantic import BaseModel, ValidationError

from werk_host.errors import ErrorCode, WerkError, validation_message
from werk_host.http.jsonbody import decode_json_body
from werk_host.protocol.envelope import data_json, success_json, success_json_text
from werk_host.service.principals import Principal

M = TypeVar("M", bound=BaseModel)


def json_body(req: falcon.Request) -> Any:
    """The request's JSON document, strictly decoded (:mod:`werk_host.http.jsonbody`)."""
    raw: bytes = req.context.body
    return decode_json_body(raw)


def parse_body(req: falcon.Request, model: type[M]) -> M:
    payload = json_body(req)
    if not isinstance(payload, dict):
        raise WerkError(ErrorCode.INVALID_REQUEST, "the request body must be a JSON object")
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


def render_data(req: falcon.Request, resp: falcon.Response, data: Any, status: int = 200) -> None:
    resp.status = status
    resp.text = success_json(req.context.request_id, data)


class _SharedTexts:
    """The serialized text of the last few shared results, by object identity.

    An entry holds its object, so the identity cannot be reused by another object while the
    entry lives; results are immutable (:class:`werk_host.control.WerkControl`), so the text
    stays right for as long as the object is handed out."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._texts: dict[int, tuple[object, str]] = {}
        self._lock = threading.Lock()

    def text(self, data: object) -> str:
        hit = self._texts.get(id(data))  # a dict read is atomic; writers hold the lock
        if hit is not None and hit[0] is data:
            return hit[1]
        text = data_json(data)
        with self._lock:
            if len(self._texts) >= self._size:
                del self._texts[next(iter(self._texts))]  # the oldest entry
            self._texts[id(data)] = (data, text)
        return text


_SHARED = _SharedTexts(64)


def render_shared(req: falcon.Request, resp: falcon.Response, data: object) -> None:
    """:func:`render_data` for a result the service hands out again while unchanged (the
    capability listing, a page of states): serialized once per object."""
    resp.status = 200
    resp.text = success_json_text(req.context.request_id, _SHARED.text(data))

"""The one mapping from typed errors to HTTP: status codes and the protocol error envelope."""

from __future__ import annotations

import logging
from typing import ClassVar

import falcon

from werk_host.errors import RETRY_AFTER, ErrorCode, WerkError
from werk_host.protocol.envelope import ErrorBody

log = logging.getLogger("werk_host.http")

STATUS: dict[ErrorCode, int] = {
    ErrorCode.INVALID_REQUEST: 400,
    ErrorCode.INCOMPATIBLE_PROTOCOL: 406,
    ErrorCode.UNAUTHORIZED: 401,
    ErrorCode.FORBIDDEN: 403,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.CONFLICT: 409,
    ErrorCode.INCOMPATIBLE_STATE: 409,
    ErrorCode.EXPIRED_HANDOFF: 410,
    ErrorCode.EXPERIMENTAL_OPT_IN_REQUIRED: 428,
    ErrorCode.RESOURCE_EXHAUSTED: 429,
    ErrorCode.UNSUPPORTED: 501,
    ErrorCode.UNAVAILABLE: 503,
    ErrorCode.CORRUPT_STATE: 500,
    ErrorCode.INTERNAL: 500,
}


class StatusError(WerkError):
    """A :class:`WerkError` answered with its own HTTP status instead of its code's (the body
    bound's 413, a media type's 415: werk_host/http/browser.py)."""

    status: ClassVar[int]


def error_body(error: WerkError) -> ErrorBody:
    """What a client may see of ``error``: code, redacted message, retryable, public details."""
    return ErrorBody(
        code=error.code,
        message=error.public_message(),
        retryable=error.retryable,
        details=error.public_details() or None,
    )


def retry_after(error: WerkError) -> int | None:
    """The seconds a refusal asks the client to wait (werk_host/service/gate.py), sent as
    ``Retry-After`` in every protocol's error answer; ``None`` for other errors."""
    value = error.details.get(RETRY_AFTER)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def status_for(error: WerkError) -> int:
    """The HTTP status of ``error``: its code's, unless it is a :class:`StatusError`."""
    return error.status if isinstance(error, StatusError) else STATUS[error.code]


def from_falcon(err: falcon.HTTPError) -> WerkError:
    """Translate framework errors (404, 405, ...) into protocol errors."""
    status = err.status_code
    if status == 404:
        return WerkError(ErrorCode.NOT_FOUND, "no such route")
    if status == 405:
        return WerkError(ErrorCode.INVALID_REQUEST, "method not allowed on this route")
    if status == 413:
        return WerkError(ErrorCode.RESOURCE_EXHAUSTED, "request body exceeds the limit", retryable=False)
    if status in (400, 411, 415, 422):
        return WerkError(ErrorCode.INVALID_REQUEST, str(err.title or "invalid request"))
    return WerkError(ErrorCode.INTERNAL, "internal error")

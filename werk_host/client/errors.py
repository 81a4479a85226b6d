"""Typed errors raised by :class:`werk_host.client.WerkProtocolClient`.

Every error is a :class:`WerkClientError` carrying ``code`` (a stable string),
``retryable``, ``request_id`` (the server's, when one was received) and ``status``
(the HTTP status, when one was received). The tree::

    WerkClientError
    ├── ClientConfigError            invalid base URL, key, timeout or argument (before any I/O)
    │   └── InvalidBaseUrlError
    ├── RequestTooLargeError         the encoded request exceeds 1 MiB (nothing was sent)
    ├── TransportError               connect/send/receive failed (retryable)
    │   └── ClientTimeoutError       the request deadline passed (retryable)
    ├── ProtocolViolationError       the server did not answer as Werk Protocol 1.x
    │   ├── FramingError             lying Content-Length, broken chunked framing, bad HTTP
    │   ├── ResponseTooLargeError    the response body exceeds 8 MiB
    │   ├── RedirectError            a 3xx answer (redirects are never followed)
    │   ├── VersionHeaderMismatchError  X-Werk-Protocol-Version disagrees with the envelope
    │   └── IncompatibleVersionError the envelope's version cannot be consumed (major/minor)
    └── WerkApiError                 a well-formed protocol error envelope; one subclass per code
        ├── InvalidRequestError, IncompatibleProtocolError, UnauthorizedError, ForbiddenError,
        ├── NotFoundError, ConflictError, IncompatibleStateError, ExpiredHandoffError,
        ├── ExperimentalOptInRequiredError, ResourceExhaustedError, UnsupportedError,
        └── UnavailableError, CorruptStateError, InternalServerError

Messages never contain the API key or a handoff: the client scrubs both from any
text a server sends back, and never chains an exception that holds response bytes.
"""

from __future__ import annotations

from typing import Any

from werk_host.errors import ErrorCode


class WerkClientError(Exception):
    """Base of every client error."""

    code: str = "client_error"
    default_retryable: bool = False

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        retryable: bool | None = None,
        request_id: str | None = None,
        status: int | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.retryable = self.default_retryable if retryable is None else retryable
        self.request_id = request_id
        self.status = status
        self.details = dict(details or {})

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(code={self.code!r}, retryable={self.retryable!r}, "
            f"status={self.status!r}, request_id={self.request_id!r})"
        )

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready description (used by the CLI's stderr output)."""
        out: dict[str, Any] = {
            "type": type(self).__name__,
            "code": self.code,
            "message": self.message,
            "retryable": self.retryable,
            "request_id": self.request_id,
            "status": self.status,
        }
        if self.details:
            out["details"] = self.details
        return out


# -- local errors (nothing sent) ---------------------------------------------------------
class ClientConfigError(WerkClientError):
    code = "invalid_client_config"


class InvalidBaseUrlError(ClientConfigError):
    code = "invalid_base_url"


class RequestTooLargeError(WerkClientError):
    code = "request_too_large"


# -- transport ---------------------------------------------------------------------------
class TransportError(WerkClientError):
    code = "transport_error"
    default_retryable = True


class ClientTimeoutError(TransportError):
    code = "timeout"


# -- the server's answer is not Werk Protocol 1.x ------------------------------------------
class ProtocolViolationError(WerkClientError):
    code = "protocol_violation"


class FramingError(ProtocolViolationError):
    code = "framing_error"


class ResponseTooLargeError(ProtocolViolationError):
    code = "response_too_large"


class RedirectError(ProtocolViolationError):
    code = "redirect"


class VersionHeaderMismatchError(ProtocolViolationError):
    code = "version_header_mismatch"


class IncompatibleVersionError(ProtocolViolationError):
    code = "incompatible_version"


# -- typed protocol errors from the server -------------------------------------------------
class WerkApiError(WerkClientError):
    """The server answered with a valid protocol error envelope."""

    code = "api_error"


class InvalidRequestError(WerkApiError):
    code = ErrorCode.INVALID_REQUEST.value


class IncompatibleProtocolError(WerkApiError):
    code = ErrorCode.INCOMPATIBLE_PROTOCOL.value


class UnauthorizedError(WerkApiError):
    code = ErrorCode.UNAUTHORIZED.value


class ForbiddenError(WerkApiError):
    code = ErrorCode.FORBIDDEN.value


class NotFoundError(WerkApiError):
    code = ErrorCode.NOT_FOUND.value


class ConflictError(WerkApiError):
    code = ErrorCode.CONFLICT.value


class IncompatibleStateError(WerkApiError):
    code = ErrorCode.INCOMPATIBLE_STATE.value


class ExpiredHandoffError(WerkApiError):
    code = ErrorCode.EXPIRED_HANDOFF.value


class ExperimentalOptInRequiredError(WerkApiError):
    code = ErrorCode.EXPERIMENTAL_OPT_IN_REQUIRED.value


class ResourceExhaustedError(WerkApiError):
    code = ErrorCode.RESOURCE_EXHAUSTED.value


class UnsupportedError(WerkApiError):
    code = ErrorCode.UNSUPPORTED.value


class UnavailableError(WerkApiError):
    code = ErrorCode.UNAVAILABLE.value


class CorruptStateError(WerkApiError):
    code = ErrorCode.CORRUPT_STATE.value


class InternalServerError(WerkApiError):
    code = ErrorCode.INTERNAL.value


#: Protocol error code -> exception class (every :class:`ErrorCode` has exactly one).
API_ERRORS: dict[ErrorCode, type[WerkApiError]] = {
    ErrorCode.INVALID_REQUEST: InvalidRequestError,
    ErrorCode.INCOMPATIBLE_PROTOCOL: IncompatibleProtocolError,
    ErrorCode.UNAUTHORIZED: UnauthorizedError,
    ErrorCode.FORBIDDEN: ForbiddenError,
    ErrorCode.NOT_FOUND: NotFoundError,
    ErrorCode.CONFLICT: ConflictError,
    ErrorCode.INCOMPATIBLE_STATE: IncompatibleStateError,
    ErrorCode.EXPIRED_HANDOFF: ExpiredHandoffError,
    ErrorCode.EXPERIMENTAL_OPT_IN_REQUIRED: ExperimentalOptInRequiredError,
    ErrorCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    ErrorCode.UNSUPPORTED: UnsupportedError,
    ErrorCode.UNAVAILABLE: UnavailableError,
    ErrorCode.CORRUPT_STATE: CorruptStateError,
    ErrorCode.INTERNAL: InternalServerError,
}

__all__ = [
    "API_ERRORS",
    "ClientConfigError",
    "ClientTimeoutError",
    "ConflictError",
    "CorruptStateError",
    "ExperimentalOptInRequiredError",
    "ExpiredHandoffError",
    "ForbiddenError",
    "FramingError",
    "IncompatibleProtocolError",
    "IncompatibleStateError",
    "IncompatibleVersionError",
    "InternalServerError",
    "InvalidBaseUrlError",
    "InvalidRequestError",
    "NotFoundError",
    "ProtocolViolationError",
    "RedirectError",
    "RequestTooLargeError",
    "ResourceExhaustedError",
    "ResponseTooLargeError",
    "TransportError",
    "UnauthorizedError",
    "UnavailableError",
    "UnsupportedError",
    "VersionHeaderMismatchError",
    "WerkApiError",
    "WerkClientError",
]

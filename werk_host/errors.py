"""Typed, transport-neutral errors of Werk Protocol 1.0.

Every layer below HTTP raises :class:`WerkError`; only ``werk_host.http`` maps a
code to an HTTP status. ``details`` is allow-listed: only keys named in
:data:`PUBLIC_DETAIL_KEYS` ever leave the process.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Final

from pydantic import ValidationError


class ErrorCode(StrEnum):
    """The protocol's error codes (docs/protocol.md, "Errors")."""

    INVALID_REQUEST = "invalid_request"
    INCOMPATIBLE_PROTOCOL = "incompatible_protocol"
    UNAUTHORIZED = "unauthorized"
    FORBIDDEN = "forbidden"
    NOT_FOUND = "not_found"
    CONFLICT = "conflict"
    INCOMPATIBLE_STATE = "incompatible_state"
    EXPIRED_HANDOFF = "expired_handoff"
    EXPERIMENTAL_OPT_IN_REQUIRED = "experimental_opt_in_required"
    RESOURCE_EXHAUSTED = "resource_exhausted"
    UNSUPPORTED = "unsupported"
    UNAVAILABLE = "unavailable"
    CORRUPT_STATE = "corrupt_state"
    INTERNAL = "internal"


#: The detail key of a retryable refusal: seconds the client should wait before retrying, sent
#: as ``Retry-After`` by every protocol's error answer (werk_host/http/errors.py).
RETRY_AFTER: Final = "retry_after"

#: Detail keys that may be exposed publicly, per code. Everything else is redacted.
PUBLIC_DETAIL_KEYS: dict[ErrorCode, frozenset[str]] = {
    ErrorCode.INCOMPATIBLE_STATE: frozenset({"mismatch_fields"}),
    # A fixed word saying why, e.g. required reuse whose only candidate was corrupt.
    ErrorCode.CONFLICT: frozenset({"reason"}),
}

#: Codes whose message is replaced by a stable public text at the HTTP boundary.
REDACTED_MESSAGES: dict[ErrorCode, str] = {
    ErrorCode.INTERNAL: "an internal control-plane operation failed",
    ErrorCode.CORRUPT_STATE: "stored state failed integrity validation",
}


class WerkError(Exception):
    """A protocol error: ``code``, human ``message``, ``retryable`` and optional ``details``.

    ``message`` must never contain API keys, handoffs, filesystem paths or raw
    backend output; internal detail belongs in the server log, not here.
    """

    def __init__(
        self,
        code: ErrorCode | str,
        message: str,
        *,
        retryable: bool = False,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = ErrorCode(code)
        self.message = message
        self.retryable = retryable
        self.details = dict(details or {})

    def public_details(self) -> dict[str, Any] | None:
        """The allow-listed subset of ``details`` that may be sent to a client."""
        allowed = PUBLIC_DETAIL_KEYS.get(self.code, frozenset())
        kept = {k: v for k, v in self.details.items() if k in allowed}
        return kept or None

    def public_message(self) -> str:
        return REDACTED_MESSAGES.get(self.code, self.message)

    def __repr__(self) -> str:
        return f"WerkError(code={self.code.value!r}, retryable={self.retryable!r})"


def invalid(message: str) -> WerkError:
    return WerkError(ErrorCode.INVALID_REQUEST, message)


def not_found(message: str = "no such state") -> WerkError:
    return WerkError(ErrorCode.NOT_FOUND, message)


def unsupported(message: str) -> WerkError:
    return WerkError(ErrorCode.UNSUPPORTED, message)


def unavailable(message: str, *, retryable: bool = True) -> WerkError:
    return WerkError(ErrorCode.UNAVAILABLE, message, retryable=retryable)


def exhausted(message: str, *, retryable: bool = True) -> WerkError:
    return WerkError(ErrorCode.RESOURCE_EXHAUSTED, message, retryable=retryable)


def corrupt(message: str = "stored state failed integrity validation") -> WerkError:
    return WerkError(ErrorCode.CORRUPT_STATE, message)


def internal(message: str = "internal error") -> WerkError:
    return WerkError(ErrorCode.INTERNAL, message)


def validation_message(err: ValidationError) -> str:
    """A useful message naming each failing field, never echoing submitted values."""
    parts = []
    for item in err.errors(include_input=False, include_url=False)[:5]:
        loc = ".".join(str(p) for p in item.get("loc", ()) if p not in ("function-after",)) or "body"
        parts.append(f"{loc}: {item.get('msg', 'invalid')}")
    more = len(err.errors()) - len(parts)
    return "; ".join(parts) + (f" (+{more} more)" if more > 0 else "")

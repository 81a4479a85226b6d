"""Reading a Werk Protocol envelope (every ``/werk/v1`` JSON answer) and OpenAI's answers.

:func:`open_envelope` enforces the rules in :mod:`werk_host.client.client`'s docstring (one
JSON object, the protocol version, request ids, one typed error per code);
:func:`open_openai` reads the OpenAI-shaped answer of ``/v1/chat/completions`` (its
``{"error": {"message", "type", "code"}}`` errors become the same typed errors, by Werk's
error code in ``code`` or, failing that, by status). ``scrub`` removes the key and any
handoff from every text a server sends back (docs/protocol.md, "Client").
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from werk_host.client.errors import (
    API_ERRORS,
    IncompatibleVersionError,
    ProtocolViolationError,
    VersionHeaderMismatchError,
)
from werk_host.client.transport import RawResponse
from werk_host.errors import ErrorCode
from werk_host.protocol import PROTOCOL_MAJOR, PROTOCOL_MINOR

MAX_REQUEST_ID_CHARS: Final = 256
#: An HTTP status Werk answers -> the code of its error when an OpenAI answer names none.
_STATUS_CODES: Final = {
    400: ErrorCode.INVALID_REQUEST,
    401: ErrorCode.UNAUTHORIZED,
    403: ErrorCode.FORBIDDEN,
    404: ErrorCode.NOT_FOUND,
    409: ErrorCode.CONFLICT,
    410: ErrorCode.EXPIRED_HANDOFF,
    429: ErrorCode.RESOURCE_EXHAUSTED,
    501: ErrorCode.UNSUPPORTED,
    503: ErrorCode.UNAVAILABLE,
}

Scrub = Callable[[str], str]


@dataclass(frozen=True)
class Answer:
    data: Any
    request_id: str
    status: int


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def _unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError("duplicate JSON object key")
        out[key] = value
    return out


def _parse_version(text: str) -> tuple[int, int] | None:
    major, dot, minor = text.strip().partition(".")
    if not dot or not major.isdigit() or not minor.isdigit() or len(major) > 6 or len(minor) > 6:
        return None
    return int(major), int(minor)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def loads_strict(text: str) -> Any:
    """``text`` as strict JSON: unique object keys, no NaN/Infinity (``ValueError`` otherwise)."""
    return json.loads(text, object_pairs_hook=_unique_object, parse_constant=_reject_constant)


def _strict_json(raw: RawResponse, violation: Callable[[str], Exception]) -> Any:
    """The body as strict JSON or the violation."""
    try:
        return loads_strict(raw.body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise violation(f"the response (HTTP {raw.status}) is not valid JSON") from None


def open_envelope(raw: RawResponse, scrub: Scrub) -> Answer:
    """The ``data`` of a success envelope, or the typed error of an error envelope."""
    status = raw.status
    header_version = raw.single("X-Werk-Protocol-Version")
    header_request_id = raw.single("X-Werk-Request-Id")

    def violation(message: str, cls: type[ProtocolViolationError] = ProtocolViolationError) -> Exception:
        rid = header_request_id if header_request_id and len(header_request_id) <= MAX_REQUEST_ID_CHARS else None
        return cls(message, status=status, request_id=rid)

    content_type = raw.single("Content-Type")
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media != "application/json":
        raise violation(
            f"the response (HTTP {status}) is not a Werk Protocol envelope: Content-Type is not application/json"
        )
    envelope = _strict_json(raw, violation)
    if not isinstance(envelope, dict) or "protocol" not in envelope:
        raise violation(f"the response (HTTP {status}) has no Werk Protocol envelope")
    protocol = envelope["protocol"]
    if (
        not isinstance(protocol, dict)
        or set(protocol) != {"major", "minor"}
        or not _is_int(protocol["major"])
        or not _is_int(protocol["minor"])
    ):
        raise violation("the response envelope has a malformed protocol version")
    major, minor = protocol["major"], protocol["minor"]
    if header_version is not None and _parse_version(header_version) != (major, minor):
        raise violation(
            f"X-Werk-Protocol-Version disagrees with the envelope's version {major}.{minor}",
            VersionHeaderMismatchError,
        )
    if major != PROTOCOL_MAJOR or minor > PROTOCOL_MINOR:
        raise violation(
            f"the server speaks Werk Protocol {major}.{minor}; this client consumes "
            f"{PROTOCOL_MAJOR}.0 through {PROTOCOL_MAJOR}.{PROTOCOL_MINOR}",
            IncompatibleVersionError,
        )
    request_id = envelope.get("request_id")
    if (
        not isinstance(request_id, str)
        or not 1 <= len(request_id) <= MAX_REQUEST_ID_CHARS
        or not request_id.isprintable()
    ):
        raise violation("the response envelope has no valid request_id")
    if header_request_id is not None and header_request_id != request_id:
        raise violation("X-Werk-Request-Id disagrees with the envelope's request_id")

    if 200 <= status < 300:
        if set(envelope) != {"protocol", "request_id", "data"}:
            raise ProtocolViolationError(
                f"a success response (HTTP {status}) must carry exactly protocol, request_id and data",
                status=status,
                request_id=request_id,
            )
        return Answer(envelope["data"], request_id, status)
    error = envelope.get("error")
    if set(envelope) != {"protocol", "request_id", "error"} or not isinstance(error, dict):
        raise ProtocolViolationError(
            f"an error response (HTTP {status}) must carry exactly protocol, request_id and error",
            status=status,
            request_id=request_id,
        )
    code, message, retryable = error.get("code"), error.get("message"), error.get("retryable")
    details = error.get("details")
    if (
        not set(error) <= {"code", "message", "retryable", "details"}
        or not isinstance(code, str)
        or not isinstance(message, str)
        or not isinstance(retryable, bool)
        or not (details is None or isinstance(details, dict))
    ):
        raise ProtocolViolationError(
            f"the error envelope (HTTP {status}) is malformed", status=status, request_id=request_id
        )
    try:
        error_code = ErrorCode(code)
    except ValueError:
        raise ProtocolViolationError(
            f"the error envelope (HTTP {status}) has an unknown code", status=status, request_id=request_id
        ) from None
    public: dict[str, Any] = {}
    if error_code is ErrorCode.INCOMPATIBLE_STATE and details is not None:
        fields = details.get("mismatch_fields")
        if isinstance(fields, list) and all(isinstance(f, str) for f in fields):
            public["mismatch_fields"] = [scrub(f) for f in fields[:64]]
    raise API_ERRORS[error_code](
        scrub(message),
        retryable=retryable,
        request_id=request_id,
        status=status,
        details=public,
    )


def open_openai(raw: RawResponse, scrub: Scrub) -> dict[str, Any]:
    """An OpenAI-shaped answer: the JSON object of a 2xx, or the typed error of its ``error``."""
    status = raw.status
    rid = raw.single("X-Werk-Request-Id")
    request_id = rid if rid and len(rid) <= MAX_REQUEST_ID_CHARS and rid.isprintable() else None

    def violation(message: str) -> Exception:
        return ProtocolViolationError(message, status=status, request_id=request_id)

    if (raw.single("Content-Type") or "").split(";", 1)[0].strip().lower() != "application/json":
        raise violation(f"the response (HTTP {status}) is not JSON")
    document = _strict_json(raw, violation)
    if not isinstance(document, dict):
        raise violation(f"the response (HTTP {status}) is not a JSON object")
    if 200 <= status < 300:
        return document
    error = document.get("error")
    if not isinstance(error, dict) or not isinstance(message := error.get("message"), str):
        raise violation(f"the error response (HTTP {status}) has no error.message")
    code = error.get("code")
    try:
        error_code = ErrorCode(code if isinstance(code, str) else "")
    except ValueError:
        error_code = _STATUS_CODES.get(status, ErrorCode.INTERNAL if status >= 500 else ErrorCode.INVALID_REQUEST)
    retryable = error_code in (ErrorCode.RESOURCE_EXHAUSTED, ErrorCode.UNAVAILABLE)
    raise API_ERRORS[error_code](scrub(message), retryable=retryable, request_id=request_id, status=status)

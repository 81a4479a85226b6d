"""Node errors: every failure a node raises is a :class:`WerkNodeError` whose text ComfyUI
shows on the node — the protocol's error code, the server's (already scrubbed) message and
the fix (docs/comfyui.md, "Errors"). Never the API key, a handoff or a request body: the host's
client scrubs the key and handoffs from every server text before it reaches here."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Final, TypeVar

from pydantic import ValidationError

from werk_host.client import TransportError, WerkApiError, WerkClientError

T = TypeVar("T")

#: The fix for each protocol error code (docs/protocol.md, "Errors").
FIXES: Final[dict[str, str]] = {
    "invalid_request": "correct the input the message names",
    "incompatible_protocol": "update werk-comfyui or werk serve so both speak Werk Protocol 1.x",
    "unauthorized": "give the Werk Connection node a valid key (its environment variable or key file)",
    "forbidden": "this key may not do that: use an operator key, or ask the server's operator",
    "not_found": "check the name: the model, state or job does not exist for this key",
    "conflict": "the target is busy or changed: run the node again",
    "incompatible_state": "the state belongs to another model or backend build: run Werk Prefill again",
    "expired_handoff": "a handoff is single-use and expires: run Werk Prefill again for a new one",
    "experimental_opt_in_required": "set allow_experimental on the node to accept an experimental operation",
    "resource_exhausted": "the server is at a limit (queue, quota or handoffs): wait and run the node again",
    "unsupported": "the serving backend does not offer this (see GET /werk/v1/capabilities)",
    "unavailable": "the backend is not ready: run the node again, or check werk serve's log",
    "corrupt_state": "the stored state failed its integrity check: evict it and prefill again",
    "internal": "werk serve failed: check its log",
}


class WerkNodeError(Exception):
    """What a Werk node raises: ComfyUI shows ``str(err)`` on the node."""

    def __init__(self, code: str, message: str, fix: str | None = None) -> None:
        self.code = code
        self.fix = fix if fix is not None else FIXES.get(code, "see docs/comfyui.md")
        super().__init__(f"Werk {code}: {message}\nFix: {self.fix}")


def invalid(message: str) -> WerkNodeError:
    return WerkNodeError("invalid_request", message)


def field_errors(err: ValidationError, names: dict[str, str] | None = None) -> str:
    """The failed fields by the node's input names, never the values."""
    parts = []
    for item in err.errors(include_input=False, include_url=False, include_context=False)[:5]:
        loc = ".".join(str(p) for p in item.get("loc", ()))
        for wire, widget in (names or {}).items():
            if loc == wire or loc.startswith(wire + "."):
                loc = widget + loc[len(wire) :]
                break
        parts.append(f"{loc or 'value'}: {item.get('msg', 'invalid')}")
    return "; ".join(parts)


def checked(build: Callable[[], T], names: dict[str, str] | None = None) -> T:
    """``build()`` (a protocol model from the node's inputs), a pydantic error as the node error."""
    try:
        return build()
    except ValidationError as err:
        raise invalid(field_errors(err, names)) from None


@contextmanager
def served(base_url: str) -> Iterator[None]:
    """The client's typed errors as node errors, each with its fix."""
    try:
        yield
    except WerkApiError as err:
        raise WerkNodeError(err.code, err.message) from None
    except TransportError as err:
        raise WerkNodeError(err.code, err.message, f"is werk serve running and reachable at {base_url}?") from None
    except WerkClientError as err:
        raise WerkNodeError(err.code, err.message, "check the Werk Connection node's server URL") from None

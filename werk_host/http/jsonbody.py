"""Strict decoding of JSON request bodies, shared by every route family.

A body that a standard JSON parser would accept can still break the layers behind it, so
before anything is validated or consumed the whole document is checked
(docs/protocol.md, "Request bodies"):

* it is UTF-8 (no byte-order mark, no encoded surrogates) and well-formed JSON;
* no ``NaN``/``Infinity`` literals, and no number that overflows a float;
* integers within the interpreter's digit limit;
* nesting at most :data:`MAX_DEPTH` arrays/objects deep;
* no lone UTF-16 surrogate (``"\\ud800"``) in any string or object key: such text cannot be
  encoded to UTF-8, so it would fail later, inside a backend, after a handoff was spent.

Every violation raises :class:`werk_host.errors.WerkError` ``invalid_request`` with a message
that never echoes the submitted content.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Final

from werk_host.errors import ErrorCode, WerkError

#: Deepest nesting of arrays/objects accepted in a request body.
MAX_DEPTH: Final = 64

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
#: A surrogate can only come from a ``\\uD8xx``–``\\uDFxx`` escape once the bytes decoded as UTF-8.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _invalid(message: str) -> WerkError:
    return WerkError(ErrorCode.INVALID_REQUEST, message)


def _reject_constant(name: str) -> Any:
    raise _invalid(f"malformed JSON: {name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _invalid("malformed JSON: a number is too large")
    return value


def _check_tree(document: Any, *, strings: bool) -> None:
    """Iteratively check nesting depth and (when ``strings``) lone surrogates."""
    stack: list[tuple[Any, int]] = [(document, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            if depth >= MAX_DEPTH:
                raise _invalid(f"the JSON body nests deeper than {MAX_DEPTH} levels")
            for key, item in value.items():
                if strings and _LONE_SURROGATE.search(key):
                    raise _invalid("the JSON body contains a lone UTF-16 surrogate")
                stack.append((item, depth + 1))
        elif isinstance(value, list):
            if depth >= MAX_DEPTH:
                raise _invalid(f"the JSON body nests deeper than {MAX_DEPTH} levels")
            stack.extend((item, depth + 1) for item in value)
        elif strings and isinstance(value, str) and _LONE_SURROGATE.search(value):
            raise _invalid("the JSON body contains a lone UTF-16 surrogate")


#: One decoder for every body (``json.loads`` with options builds one per call).
_DECODER: Final = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite_float)


def decode_json_body(raw: bytes) -> Any:
    """Decode and check a request body; raises ``invalid_request`` on any violation."""
    if not raw:
        raise _invalid("a JSON request body is required")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise _invalid("malformed JSON: the body is not valid UTF-8") from err
    try:
        if text.startswith("\ufeff"):  # as json.loads
            raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
        document = _DECODER.decode(text)
    except json.JSONDecodeError as err:
        raise _invalid(f"malformed JSON: {err.msg} at position {err.pos}") from err
    except RecursionError as err:
        raise _invalid(f"the JSON body nests deeper than {MAX_DEPTH} levels") from err
    except ValueError as err:  # e.g. an integer beyond the interpreter's digit limit
        raise _invalid("malformed JSON: a number is too large") from err
    strings = _SURROGATE_ESCAPE.search(text) is not None
    if strings or text.count("{") + text.count("[") > MAX_DEPTH:
        # (no more opening brackets than MAX_DEPTH, in strings or not: it cannot nest deeper)
        _check_tree(document, strings=strings)
    return document

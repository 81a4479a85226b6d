"""What every Werk node shares: ComfyUI's node interface (``INPUT_TYPES``, ``RETURN_TYPES``,
``FUNCTION``, ``CATEGORY``, ``VALIDATE_INPUTS``) and the strict validator.

Each node's :meth:`WerkNode.build` turns the node's widget values into the protocol's own
request model (:mod:`werk_host.protocol`, the models ``werk serve`` validates with) and raises a
:class:`~werk_comfyui.errors.WerkNodeError` naming the input. ComfyUI calls
``VALIDATE_INPUTS`` with the widget values before the graph runs (an input fed by a link is
absent there: its :attr:`WerkNode.PLACEHOLDERS` value stands in); the node's function
calls ``build`` again with every value before it sends anything. So every input is checked
before any request, and a refused input is a node error (docs/comfyui.md, "Validation").
"""

from __future__ import annotations

import json
import math
from typing import Any, ClassVar, Final

from werk_host.client.envelope import loads_strict

from .errors import WerkNodeError, invalid

CATEGORY: Final = "Werk"
MAX_SEED: Final = 2**63 - 1
#: ComfyUI's widget for an optional model name (empty: the server's default model).
MODEL_INPUT: Final = ("STRING", {"default": "", "tooltip": "the model name; empty: the server's default"})


class WerkNode:
    """A Werk node (module docstring)."""

    CATEGORY: ClassVar[str] = CATEGORY
    FUNCTION: ClassVar[str] = "run"
    #: Stand-ins, at validation, for inputs a link feeds (their values are known only when run).
    PLACEHOLDERS: ClassVar[dict[str, Any]] = {}

    @classmethod
    def build(cls, **inputs: Any) -> Any:
        """The protocol request for ``inputs`` (subclasses); raises :class:`WerkNodeError`."""
        return None

    @classmethod
    def VALIDATE_INPUTS(cls, **inputs: Any) -> bool | str:
        values = {**cls.PLACEHOLDERS, **{k: v for k, v in inputs.items() if v is not None}}
        try:
            cls.build(**values)
        except WerkNodeError as err:
            return str(err)
        return True


def text(inputs: dict[str, Any], name: str, *, required: bool = True, limit: int = 1 << 20) -> str | None:
    """A string input: ``None`` when empty and optional; a clear error otherwise."""
    value = inputs.get(name, "")
    if not isinstance(value, str):
        raise invalid(f"{name}: must be text")
    if len(value.encode("utf-8", "surrogatepass")) > limit:
        raise invalid(f"{name}: at most {limit} bytes")
    if not value.strip():
        if required:
            raise invalid(f"{name}: must not be empty")
        return None
    return value


def integer(inputs: dict[str, Any], name: str, low: int, high: int) -> int:
    value = inputs.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise invalid(f"{name}: must be a whole number from {low} to {high}")
    return value


def number(inputs: dict[str, Any], name: str, low: float, high: float) -> float:
    value = inputs.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise invalid(f"{name}: must be a number from {low} to {high}")
    if not low <= value <= high:
        raise invalid(f"{name}: must be a number from {low} to {high}")
    return float(value)


def flag(inputs: dict[str, Any], name: str) -> bool:
    value = inputs.get(name, False)
    if not isinstance(value, bool):
        raise invalid(f"{name}: must be true or false")
    return value


def choice(inputs: dict[str, Any], name: str, options: tuple[str, ...]) -> str:
    value = inputs.get(name)
    if value not in options:
        raise invalid(f"{name}: one of {', '.join(options)}")
    return str(value)


def json_object(inputs: dict[str, Any], name: str) -> dict[str, Any]:
    """A JSON-object text input (empty: ``{}``), strict: no duplicate keys, no NaN."""
    raw = text(inputs, name, required=False, limit=64 << 10)
    if raw is None:
        return {}
    try:
        value = loads_strict(raw)
    except (ValueError, RecursionError):
        raise invalid(f"{name}: must be a JSON object (strict JSON, no duplicate keys)") from None
    if not isinstance(value, dict):
        raise invalid(f"{name}: must be a JSON object")
    return value


def shown(value: Any) -> str:
    """A protocol answer as the JSON text a ``STRING`` output carries (no secrets are in it)."""
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)

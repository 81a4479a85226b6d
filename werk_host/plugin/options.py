"""Backend request options: the ``werk.<name>`` members of a chat request that one backend owns
(docs/plugin-hooks.md, ``werk_request_options``; docs/plugin-kit.md, "Backend options").

The host checks only that each backend member is a JSON object with a lowercase name; for every
one it calls ``werk_request_options`` on the request's adapter, whose plugin validates the
content. A backend declares its options as a :class:`RequestOptions` model and implements the
hook with :func:`validate_options`; the options it returns are what its chat hooks then receive
in ``request["werk"][name]`` (and what ``werk_count_tokens`` sees unchanged in
``request.werk``). The contract of the hook:

* its own member (``name``): return the validated options, or raise ``invalid_request``
  naming the field (``werk.omlx.expert_cache_mb: ...``), never echoing the submitted value;
* anyone else's: return ``None``; the host then answers ``invalid_request``
  ``werk.<name> is not supported by backend <id>`` on chat and on the planning routes alike.

The field types below read JSON as the host's own protocol does: an integer is a JSON number
without a fraction (``5`` or ``5.0``, never ``true`` or ``"5"``) and a boolean is a JSON boolean.
"""

from __future__ import annotations

from typing import Annotated, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, StrictBool, StrictInt, ValidationError

from werk_host.errors import ErrorCode, WerkError
from werk_host.protocol.base import integral_number
from werk_host.seam import JsonObject

__all__ = ["OptionBool", "OptionInt", "RequestOptions", "options_error", "validate_options"]

#: An integer option (bounds go before the validator: ``Annotated[OptionInt, Field(ge=1)]``).
OptionInt = Annotated[StrictInt, BeforeValidator(integral_number)]
OptionBool = StrictBool

M = TypeVar("M", bound=BaseModel)


class RequestOptions(BaseModel):
    """Base of a backend's options model: unknown members are refused, omitted ones are ``None``
    (they inherit the server's settings)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def options_error(name: str, err: ValidationError) -> WerkError:
    """``invalid_request`` naming each failing option as ``werk.<name>.<option>`` (at most five;
    the alternatives of a union joined by "or"), without the submitted values."""
    found: dict[str, list[str]] = {}
    for item in err.errors(include_input=False, include_url=False):
        loc = item.get("loc", ())
        field = f"werk.{name}.{loc[0]}" if loc else f"werk.{name}"
        messages = found.setdefault(field, [])
        message = str(item.get("msg", "invalid"))
        if message not in messages:
            messages.append(message)
    parts = [f"{field}: {_either(messages)}" for field, messages in list(found.items())[:5]]
    more = len(found) - len(parts)
    return WerkError(ErrorCode.INVALID_REQUEST, "; ".join(parts) + (f" (+{more} more)" if more > 0 else ""))


def _either(messages: list[str]) -> str:
    lead = "Input should be "
    if len(messages) > 1 and all(m.startswith(lead) for m in messages):
        return lead + " or ".join(m.removeprefix(lead) for m in messages)
    return " or ".join(messages)


def validate_options(model: type[M], name: str, options: JsonObject) -> M:
    """``options`` (the member ``werk.<name>``) as ``model``; :func:`options_error` when invalid."""
    try:
        return model.model_validate(options)
    except ValidationError as err:
        raise options_error(name, err) from None

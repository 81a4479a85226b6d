"""``werk.omlx``: the oMLX backend's own chat-request options (docs/omlx.md, "Chat options").

The host passes every backend member of a chat request's ``werk`` to the adapter's plugin
(``werk_request_options``); this plugin owns ``werk.omlx`` and validates it with
:class:`OmlxChatOptions`: ``thinking`` (boolean), ``expert_cache_mb`` (1 … 1048576 MiB) and
``ngram_cache_mb`` (``"auto"`` or 0 … 1048576 MiB); any other member, or another type, is
``invalid_request`` naming the field. Omitted members inherit the server's settings. What the
worker serving a request can do with valid options (it has no n-gram cache; ``omlx serve`` owns
its caches) is checked when the chat request is made (:class:`ChatOptions`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field

from werk_host.plugin import ErrorCode, JsonObject, WerkError
from werk_host.plugin.options import OptionBool, OptionInt, RequestOptions, validate_options

__all__ = ["MAX_CACHE_MB", "MEMBER", "MIB", "ChatOptions", "OmlxChatOptions", "validated_options"]

#: The backend member this plugin owns: ``werk.omlx``.
MEMBER = "omlx"
MIB = 1024 * 1024
#: The largest MiB value a cache size option accepts (1 TiB).
MAX_CACHE_MB = 1024 * 1024


class OmlxChatOptions(RequestOptions):
    """``werk.omlx`` (module docstring)."""

    thinking: OptionBool | None = None
    expert_cache_mb: Annotated[OptionInt, Field(ge=1, le=MAX_CACHE_MB)] | None = None
    ngram_cache_mb: Annotated[OptionInt, Field(ge=0, le=MAX_CACHE_MB)] | Literal["auto"] | None = None


def validated_options(name: str, options: JsonObject) -> JsonObject | None:
    """The ``werk_request_options`` rule: ``werk.omlx`` validated (omitted members left out),
    ``None`` for any other backend's member."""
    if name != MEMBER:
        return None
    checked = validate_options(OmlxChatOptions, name, options)
    dumped: JsonObject = checked.model_dump(mode="json", exclude_none=True)
    return dumped


@dataclass(frozen=True)
class ChatOptions:
    """The ``werk.omlx`` members of a chat body, as this plugin validated them."""

    thinking: bool | None = None
    budget_bytes: int | None = None

    @classmethod
    def of(cls, body: JsonObject) -> ChatOptions:
        werk = body.get("werk")
        options = werk.get(MEMBER) if isinstance(werk, dict) else None
        if not isinstance(options, dict):
            return cls()
        ngram = options.get("ngram_cache_mb")
        if isinstance(ngram, int) and not isinstance(ngram, bool) and ngram > 0:
            raise WerkError(
                ErrorCode.INVALID_REQUEST, "werk.omlx.ngram_cache_mb: the Werk MLX worker has no n-gram cache"
            )
        thinking = options.get("thinking")
        budget = options.get("expert_cache_mb")
        return cls(
            thinking=thinking if isinstance(thinking, bool) else None,
            budget_bytes=budget * MIB if isinstance(budget, int) and not isinstance(budget, bool) else None,
        )

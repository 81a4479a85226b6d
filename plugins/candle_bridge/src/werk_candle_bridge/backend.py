"""What the plugin module declares about the candle backend without importing its adapter (and
with it the engine's template and generation modules): the ids, the capabilities its adapters
report on, its options' check and which models it accepts. ``werk serve`` loads every plugin to
choose a model's backend; :mod:`werk_candle_bridge.adapter` is imported only once a candle
instance is created (docs/operations.md, "Start-up")."""

from __future__ import annotations

from collections.abc import Mapping

from werk_host.plugin import CapabilityId, ErrorCode, ModelManifest, WerkError

BACKEND_ID = "candle"
PLUGIN_NAME = "candle"
OPTIONS = ("max_seqs", "prefix_cache_n")

CHAT_CAPABILITIES = (
    (
        CapabilityId.TOKEN_COUNT,
        "exact: the engine's tokenizer counts the prompt Werk renders with the model's template",
    ),
    (CapabilityId.ADMISSION, "from the exact token count and the engine's max_sequence_length()"),
)
#: Every id :meth:`~werk_candle_bridge.adapter.CandleAdapter.capabilities` reports on (declared on the adapter factory).
REPORTED_CAPABILITIES = (
    CapabilityId.MODEL_RESIDENCY,
    CapabilityId.PREFIX_CACHE,
    *(cap_id for cap_id, _ in CHAT_CAPABILITIES),
    CapabilityId.CHAT_LIMITS,
    CapabilityId.REASONING,
)


def _option_int(options: Mapping[str, object], name: str, low: int) -> int | None:
    value = options.get(name)
    if value is None:
        return None
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise WerkError(ErrorCode.INVALID_REQUEST, f"backend option candle.{name} must be an integer of at least {low}")
    return value


def check_options(options: Mapping[str, object]) -> None:
    """``invalid_request`` for an option the engine does not take or a bad value: what
    :func:`~werk_candle_bridge.adapter.engine_settings` refuses, asked of a profile's options
    when ``werk serve`` starts."""
    unknown = sorted(k for k in options if k not in OPTIONS)
    if unknown:
        raise WerkError(
            ErrorCode.INVALID_REQUEST, f"unknown backend option candle.{unknown[0]} (known: {', '.join(OPTIONS)})"
        )
    _option_int(options, "max_seqs", 1)
    _option_int(options, "prefix_cache_n", 0)


def accepts(manifest: ModelManifest | None) -> bool:
    """Only models pinned to this backend (``werk models add NAME FILE.gguf --backend candle``):
    an unpinned GGUF is left to llama.cpp."""
    return manifest is not None and manifest.backend in (BACKEND_ID, PLUGIN_NAME)

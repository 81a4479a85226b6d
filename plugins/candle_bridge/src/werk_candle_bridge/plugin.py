"""werk-candle-bridge's plugin module: the entry point ``werk: candle`` names it.

It offers the adapter factory and the doctor checks; every operation hook is a method of
:class:`werk_candle_bridge.adapter.CandleAdapter`, which the host registers with its plugin
manager when it creates the adapter (docs/plugin-hooks.md). Importing this module never
imports the engine, so the plugin loads on every platform.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import JsonValue

from werk_host.plugin import (
    AdapterFactory,
    DoctorCheck,
    HostConfig,
    WerkError,
    hookimpl,
)

from . import doctor
from .adapter import (
    BACKEND_ID,
    PLUGIN_NAME,
    REPORTED_CAPABILITIES,
    accepts,
    check_options,
    create_adapter,
)

__all__ = ["PLUGIN_NAME", "werk_adapter_factories", "werk_doctor_checks"]


@hookimpl
def werk_adapter_factories(config: HostConfig) -> list[AdapterFactory]:
    return [
        AdapterFactory(
            BACKEND_ID,
            accepts,
            create_adapter,
            "in-process mistral.rs (Candle) engine for GGUF models",
            capabilities=REPORTED_CAPABILITIES,
            validate_options=_validate_options,
        )
    ]


def _validate_options(options: Mapping[str, JsonValue]) -> None:
    """An instance's profile options, checked when ``werk serve`` starts by the rules the engine
    settings apply (docs/plugin-kit.md, "Options")."""
    try:
        check_options(options)
    except WerkError as err:
        raise ValueError(err.message) from err


@hookimpl
def werk_doctor_checks(config: HostConfig) -> list[DoctorCheck]:
    return doctor.checks(config)

"""werk-candle-bridge's plugin module: the entry point ``werk: candle`` names it.

It offers the adapter factory and the doctor checks; every operation hook is a method of
:class:`werk_candle_bridge.adapter.CandleAdapter`, which the host registers with its plugin
manager when it creates the adapter (docs/plugin-hooks.md). Importing this module never
imports the engine, so the plugin loads on every platform; the adapter module is imported when
a candle instance is created and the doctor's when its checks run (docs/operations.md,
"Start-up").
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import JsonValue

from werk_host.plugin import (
    Adapter,
    AdapterFactory,
    DoctorCheck,
    HostConfig,
    ModelManifest,
    WerkError,
    hookimpl,
)

from .backend import BACKEND_ID, PLUGIN_NAME, REPORTED_CAPABILITIES, accepts, check_options

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


def create_adapter(config: HostConfig, manifest: ModelManifest | None) -> Adapter:
    """:func:`werk_candle_bridge.adapter.create_adapter`, imported when the first candle
    instance is created."""
    from .adapter import create_adapter as create

    return create(config, manifest)


def _validate_options(options: Mapping[str, JsonValue]) -> None:
    """An instance's profile options, checked when ``werk serve`` starts by the rules the engine
    settings apply (docs/plugin-kit.md, "Options")."""
    try:
        check_options(options)
    except WerkError as err:
        raise ValueError(err.message) from err


@hookimpl
def werk_doctor_checks(config: HostConfig) -> list[DoctorCheck]:
    from . import doctor

    return doctor.checks(config)

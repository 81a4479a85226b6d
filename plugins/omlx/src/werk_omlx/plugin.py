"""werk-omlx's plugin module: MLX checkpoints with MoE expert offload for Werk host (entry point
``omlx``).

It holds the collected hooks only: the adapter factory and the doctor checks. Every operation
is a method of :class:`~werk_omlx.adapter.OmlxAdapter` marked ``@hookimpl(specname=...)``; the
host registers each adapter it creates, so its operations reach that adapter's own methods
(docs/plugin-kit.md); the adapter module is imported when an oMLX instance is created and the
doctor's when its checks run (docs/operations.md, "Start-up"). Named state, snapshots,
restores, tier moves and split prefill/decode are not implemented: the host answers them
``unsupported``.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import JsonValue

from werk_host.plugin import Adapter, AdapterFactory, DoctorCheck, HostConfig, ModelManifest, WerkError, hookimpl

from .backend import BACKEND_ID, REPORTED_CAPABILITIES, Settings, accepts


@hookimpl
def werk_adapter_factories(config: HostConfig) -> list[AdapterFactory]:
    return [
        AdapterFactory(
            BACKEND_ID,
            accepts,
            create_adapter,
            "MLX checkpoints in a Werk-owned mlx-lm worker with MoE expert offload (or omlx serve on Apple silicon)",
            capabilities=REPORTED_CAPABILITIES,
            validate_options=_validate_options,
        )
    ]


def create_adapter(config: HostConfig, manifest: ModelManifest | None) -> Adapter:
    """:func:`werk_omlx.adapter.create_adapter`, imported when the first oMLX instance is
    created."""
    from .adapter import create_adapter as create

    return create(config, manifest)


def _validate_options(options: Mapping[str, JsonValue]) -> None:
    """An instance's profile options, checked when ``werk serve`` starts by the rules the worker
    settings apply (docs/plugin-kit.md, "Options")."""
    try:
        Settings.parse(dict(options))
    except WerkError as err:
        raise ValueError(err.message) from err


@hookimpl
def werk_doctor_checks(config: HostConfig) -> list[DoctorCheck]:
    from . import doctor

    return doctor.checks(config)

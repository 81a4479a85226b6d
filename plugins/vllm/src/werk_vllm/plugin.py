"""werk-vllm's plugin module: the vLLM backend for Werk host (entry point ``vllm``).

It holds the collected hooks only: the adapter factory and the doctor checks. Every operation
is a method of :class:`~werk_vllm.adapter.VllmAdapter` marked ``@hookimpl(specname=...)``; the
host registers each adapter it creates, so its operations reach that adapter's own methods
(docs/plugin-kit.md). The adapter module is imported when a vLLM instance is created and the
doctor's when its checks run, not when the plugin loads (docs/operations.md, "Start-up").
vLLM offers no named state, snapshot, restore, tier or expert control: those hooks are
deliberately not implemented (the host answers them ``unsupported``).
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

from .backend import BACKEND_ID, REPORTED_CAPABILITIES, accepts
from .launch import parse_options


@hookimpl
def werk_adapter_factories(config: HostConfig) -> list[AdapterFactory]:
    return [
        AdapterFactory(
            BACKEND_ID,
            accepts,
            create_adapter,
            "vLLM: a Werk-started vllm serve (Hugging Face model directory) or a remote endpoint",
            capabilities=REPORTED_CAPABILITIES,
            validate_options=_validate_options,
        )
    ]


def create_adapter(config: HostConfig, manifest: ModelManifest | None) -> Adapter:
    """:func:`werk_vllm.adapter.create_adapter`, imported when the first vLLM instance starts."""
    from .adapter import create_adapter as create

    return create(config, manifest)


def _validate_options(options: Mapping[str, JsonValue]) -> None:
    """An instance's profile options (``endpoint`` and ``api_key_env`` included), checked when
    ``werk serve`` starts by the rules the adapter applies (docs/plugin-kit.md, "Options")."""
    try:
        parse_options(options)
    except WerkError as err:
        raise ValueError(err.message) from err


@hookimpl
def werk_doctor_checks(config: HostConfig) -> list[DoctorCheck]:
    from . import doctor

    return doctor.checks(config)

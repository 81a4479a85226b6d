"""werk-openai-upstream's plugin module: the entry point ``werk: openai_upstream`` names it.

It offers the factory (its options checked by :func:`werk_host.plugin.remote.check_options`
when ``werk serve`` starts) and one doctor check; every operation is a method of
:class:`werk_openai_upstream.adapter.UpstreamAdapter` (docs/plugin-kit.md).
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import JsonValue

from werk_host.plugin import AdapterFactory, DoctorCheck, HostConfig, hookimpl
from werk_host.plugin.remote import check_options

from .adapter import BACKEND_ID, REPORTED, accepts, create_adapter

__all__ = ["PLUGIN_NAME", "werk_adapter_factories", "werk_doctor_checks"]

PLUGIN_NAME = BACKEND_ID


def validate_options(options: Mapping[str, JsonValue]) -> None:
    """An instance's own options (``endpoint``, ``api_key_env`` included), checked when ``werk
    serve`` starts: a :class:`ValueError` names the option at fault."""
    check_options(options)


@hookimpl
def werk_adapter_factories(config: HostConfig) -> list[AdapterFactory]:
    return [
        AdapterFactory(
            BACKEND_ID,
            accepts,
            create_adapter,
            "any OpenAI-compatible server elsewhere (a remote instance's endpoint)",
            tuple(REPORTED),
            validate_options=validate_options,
        )
    ]


@hookimpl
def werk_doctor_checks(config: HostConfig) -> list[DoctorCheck]:
    detail = "nothing to install: remote instances name their endpoint (docs/deployments.md)"
    return [DoctorCheck(f"{BACKEND_ID}.relay", "ok", detail)]

"""werk-openai-upstream's plugin module: the entry point ``werk: openai_upstream`` names it.

It offers the factory (its options checked by :func:`werk_host.plugin.remote.check_options`
when ``werk serve`` starts) and one doctor check; every operation is a method of
:class:`werk_openai_upstream.adapter.UpstreamAdapter` (docs/plugin-kit.md).
"""

from __future__ import annotations

from werk_host.plugin import AdapterFactory, DoctorCheck, HostConfig, hookimpl
from werk_host.plugin.remote import check_options

from .adapter import BACKEND_ID, REPORTED, accepts, create_adapter

__all__ = ["PLUGIN_NAME", "werk_adapter_factories", "werk_doctor_checks"]

PLUGIN_NAME = BACKEND_ID


@hookimpl
def werk_adapter_factories(config: HostConfig) -> list[AdapterFactory]:
    return [
        AdapterFactory(
            BACKEND_ID,
            accepts,
            create_adapter,
            "any OpenAI-compatible server elsewhere (a remote instance's endpoint)",
            tuple(REPORTED),
            validate_options=check_options,  # the instance's own options, endpoint included
        )
    ]


@hookimpl
def werk_doctor_checks(config: HostConfig) -> list[DoctorCheck]:
    detail = "nothing to install: remote instances name their endpoint (docs/deployments.md)"
    return [DoctorCheck(f"{BACKEND_ID}.relay", "ok", detail)]

"""werk-llamacpp's plugin module: the llama.cpp backend for Werk host (entry point ``llamacpp``).

It holds the collected hooks only: the adapter factory, the doctor checks and the ``werk
llamacpp`` commands. Every operation (prefill, decode, chat, counting, ...) is a method of
:class:`~werk_llamacpp.adapter.LlamaCppAdapter` marked ``@hookimpl(specname=...)``; the host
registers each adapter it creates, so its operations reach that adapter's own methods
(docs/plugin-kit.md).
"""

from __future__ import annotations

from werk_host.plugin import AdapterFactory, DoctorCheck, HostConfig, hookimpl

from . import doctor
from .adapter import accepts, create_adapter
from .capabilities import REPORTED_CAPABILITIES
from .cli import werk_cli_commands as werk_cli_commands  # `werk llamacpp`; `werk` imports only .cli
from .core import BACKEND_ID
from .footprint import memory_estimate
from .options import validate_options


@hookimpl
def werk_adapter_factories(config: HostConfig) -> list[AdapterFactory]:
    return [
        AdapterFactory(
            BACKEND_ID,
            accepts,
            create_adapter,
            "managed llama-server (GGUF)",
            capabilities=REPORTED_CAPABILITIES,
            validate_options=validate_options,
            memory_estimate=memory_estimate,
        )
    ]


@hookimpl
def werk_doctor_checks(config: HostConfig) -> list[DoctorCheck]:
    return doctor.checks(config)

"""werk-template's plugin module: the entry point ``werk: template`` (pyproject.toml) names it.

A plugin module offers only the collected hooks: its adapter factories and doctor checks
(and, if it adds ``werk`` commands, ``werk_cli_commands``). Every operation hook is a method of
:class:`werk_template.adapter.TemplateAdapter`, which the host registers with its plugin
manager when it creates the adapter (docs/plugin-hooks.md).
"""

from __future__ import annotations

from werk_host.plugin import AdapterFactory, DoctorCheck, HostConfig, hookimpl

from .adapter import BACKEND_ID, REPORTED, accepts, create_adapter

__all__ = ["PLUGIN_NAME", "werk_adapter_factories", "werk_doctor_checks"]

#: The entry-point name (pyproject.toml), under which werk_host.testing registers this module;
#: the host derives the owner of the adapters from the entry point itself.
PLUGIN_NAME = BACKEND_ID


@hookimpl
def werk_adapter_factories(config: HostConfig) -> list[AdapterFactory]:
    # COPIERS: say in a few words what your backend serves.
    return [AdapterFactory(BACKEND_ID, accepts, create_adapter, "in-process template engine", tuple(REPORTED))]


# COPIERS: replace this with checks of what your engine needs here (an executable found and its
# `--version`, a native module importable, the platform), each with the fix when it is missing.
# Keep it cheap: no model loads, no process but bounded --version/--help probes
# (docs/plugin-kit.md, "Doctor checks").
@hookimpl
def werk_doctor_checks(config: HostConfig) -> list[DoctorCheck]:
    return [DoctorCheck(f"{BACKEND_ID}.engine", "ok", "the template engine runs in werk serve; nothing to install")]

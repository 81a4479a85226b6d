"""Where the llama.cpp plugin's hooks live (docs/plugin-kit.md): the plugin module holds only the
collected hooks (factories, doctor checks, ``werk llamacpp`` commands); every operation is one
method of :class:`LlamaCppAdapter`, marked ``@hookimpl(specname=...)``, with no forwarder
between the hook and the method."""

from __future__ import annotations

import inspect

from werk_llamacpp import plugin
from werk_llamacpp.adapter import LlamaCppAdapter

COLLECTED = {"werk_adapter_factories", "werk_doctor_checks", "werk_cli_commands"}
#: The operations this backend implements (docs/plugin-hooks.md lists every hook).
OPERATIONS = {
    "werk_capabilities",
    "werk_compat_key",
    "werk_prefill",
    "werk_snapshot",
    "werk_restore",
    "werk_decode",
    "werk_release_state",
    "werk_state_move",
    "werk_count_tokens",
    "werk_chat_limits",
    "werk_reasoning_profile",
    "werk_chat_completion",
    "werk_text_completion",
    "werk_session_slot",
    "werk_prompt_cache",
    "werk_workers",
    "werk_deployment_plan",
    "werk_log_tail",
}


def _hooks(obj: object) -> list[str]:
    """The hook names of ``obj``'s members marked as Werk hook implementations."""
    names: list[str] = []
    for name, value in inspect.getmembers_static(obj):
        opts = getattr(value, "werk_impl", None)
        if isinstance(opts, dict):
            names.append(opts.get("specname") or name)
    return sorted(names)


def test_the_plugin_module_holds_only_the_collected_hooks() -> None:
    assert _hooks(plugin) == sorted(COLLECTED)


def test_every_operation_is_one_adapter_method() -> None:
    assert _hooks(LlamaCppAdapter) == sorted(OPERATIONS)

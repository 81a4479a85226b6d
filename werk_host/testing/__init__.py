"""werk_host.testing: the test kit for the host and for any backend plugin's own suite.

Shipped in the werk-host wheel and registered as the pytest plugin ``werk_host`` (entry point
``pytest11``), so a plugin's tests get its fixtures without a conftest.

* :mod:`~werk_host.testing.reference`: the reference backend, an in-memory plugin
  (:class:`MemoryBackendPlugin`, :class:`MemoryAdapter`) implementing every hook of
  :mod:`werk_host.hookspecs`, with configurable capability statuses and failure injection.
* :mod:`~werk_host.testing.hosts`: build a host around any plugin object or module and serve
  it on an ephemeral port (:func:`make_host`, :func:`running`, :func:`serving`,
  :func:`backend_host`, :func:`install_model`).
* :mod:`~werk_host.testing.api`: :class:`Api`, a tiny JSON-over-HTTP caller for real servers.
* :mod:`~werk_host.testing.processes`: :func:`gone`, wait for a process to exit.
* :mod:`~werk_host.testing.markers`: :func:`covers_hooks`, tag tests with the hooks they cover.
* :mod:`~werk_host.testing.pytest_plugin`: fixtures ``werk_home``, ``werk_api_key`` and
  ``werk_server`` (a :class:`WerkServerFactory`), and the ``llamaserver``/``slow`` markers.

The names below are re-exported lazily (on first attribute access), so importing this package,
as pytest does for the plugin, does not import the server.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from werk_host.testing.api import Api, JsonBody, ParamValue
    from werk_host.testing.hosts import (
        DEFAULT_PARAMS,
        MODEL,
        LiveHost,
        backend_host,
        install_model,
        make_host,
        plugin_name_of,
        running,
        serving,
    )
    from werk_host.testing.markers import COVERED_HOOKS_ATTR, covered_hooks, covers_hooks
    from werk_host.testing.processes import gone
    from werk_host.testing.pytest_plugin import WerkServerFactory
    from werk_host.testing.reference import (
        BACKEND_ID,
        CONTEXT_TOKENS,
        EXPERIMENTAL_STATE,
        EXPERTS_PER_MODEL,
        MAX_OUTPUT_TOKENS,
        PLUGIN_NAME,
        MemoryAdapter,
        MemoryBackendPlugin,
        count_chat_tokens,
        default_experts,
    )

__all__ = [
    "Api",
    "BACKEND_ID",
    "CONTEXT_TOKENS",
    "COVERED_HOOKS_ATTR",
    "DEFAULT_PARAMS",
    "EXPERIMENTAL_STATE",
    "EXPERTS_PER_MODEL",
    "JsonBody",
    "LiveHost",
    "MAX_OUTPUT_TOKENS",
    "MODEL",
    "MemoryAdapter",
    "MemoryBackendPlugin",
    "PLUGIN_NAME",
    "ParamValue",
    "WerkServerFactory",
    "backend_host",
    "count_chat_tokens",
    "covered_hooks",
    "covers_hooks",
    "default_experts",
    "gone",
    "install_model",
    "make_host",
    "plugin_name_of",
    "running",
    "serving",
]

#: The submodule each re-exported name lives in.
_MODULES: dict[str, tuple[str, ...]] = {
    "api": ("Api", "JsonBody", "ParamValue"),
    "hosts": (
        "DEFAULT_PARAMS",
        "MODEL",
        "LiveHost",
        "backend_host",
        "install_model",
        "make_host",
        "plugin_name_of",
        "running",
        "serving",
    ),
    "markers": ("COVERED_HOOKS_ATTR", "covered_hooks", "covers_hooks"),
    "processes": ("gone",),
    "pytest_plugin": ("WerkServerFactory",),
    "reference": (
        "BACKEND_ID",
        "CONTEXT_TOKENS",
        "EXPERIMENTAL_STATE",
        "EXPERTS_PER_MODEL",
        "MAX_OUTPUT_TOKENS",
        "PLUGIN_NAME",
        "MemoryAdapter",
        "MemoryBackendPlugin",
        "count_chat_tokens",
        "default_experts",
    ),
}
_EXPORTS = {name: module for module, exported in _MODULES.items() for name in exported}


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})

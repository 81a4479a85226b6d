"""Werk host: Werk Protocol 1.0 runtime control over pluggable local LLM backends."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

import pluggy

try:
    __version__ = version("werk-host")
except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
    __version__ = "0.0.0"

#: Marker for plugin implementations: ``@werk_host.hookimpl def werk_...``.
hookimpl = pluggy.HookimplMarker("werk")

__all__ = ["__version__", "hookimpl"]

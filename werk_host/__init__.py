"""Werk host: Werk Protocol 1.0 runtime control over pluggable local LLM backends.

The package's two names are made on first use: ``werk serve`` starts its remembered backend
child before anything else is imported (docs/operations.md, "Remembered launches").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pluggy

    #: Marker for plugin implementations: ``@werk_host.hookimpl def werk_...``.
    hookimpl: pluggy.HookimplMarker
    __version__: str

__all__ = ["__version__", "hookimpl"]


def __getattr__(name: str) -> object:
    value: object
    if name == "hookimpl":
        import pluggy

        value = pluggy.HookimplMarker("werk")
    elif name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            value = version("werk-host")
        except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
            value = "0.0.0"
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value

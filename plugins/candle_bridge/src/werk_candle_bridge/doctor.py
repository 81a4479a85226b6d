"""What ``werk doctor`` checks for the candle bridge (docs/cli.md, "werk doctor"; docs/plugin-kit.md,
"Doctor checks"; docs/candle.md, "Platforms").

``candle.mistralrs``: whether the engine imports in this process
(:func:`werk_candle_bridge.engine.missing_engine_reason`, which imports it once; no model is
loaded) and its installed version. ``ok`` with the version (``warn`` when it is not the
:data:`TESTED_VERSION` the bridge was measured with); ``fail`` when it does not import on a
platform it has wheels for, with the ``pip install`` fix; ``warn`` on a platform without
wheels, where the plugin is unavailable by design.
"""

from __future__ import annotations

import importlib.metadata
import platform
import sys

from werk_host.plugin import DoctorCheck, HostConfig

from .backend import PLUGIN_NAME
from .engine import DISTRIBUTION, missing_engine_reason

#: The mistralrs version the bridge depends on (plugins/candle_bridge/pyproject.toml).
TESTED_VERSION = "0.9.5"
CHECK = f"{PLUGIN_NAME}.mistralrs"
#: (sys.platform, platform.machine()) pairs mistralrs publishes wheels for.
WHEEL_PLATFORMS = frozenset({("linux", "x86_64"), ("darwin", "arm64"), ("win32", "AMD64")})
INSTALL_FIX = f"pip install '{DISTRIBUTION}=={TESTED_VERSION}' (or reinstall werk-candle-bridge)"


def _version() -> str | None:
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None


def checks(config: HostConfig) -> list[DoctorCheck]:
    """The candle check (see the module docstring)."""
    why = missing_engine_reason()
    version = _version()
    if why is not None:
        if (sys.platform, platform.machine()) not in WHEEL_PLATFORMS:
            fix = "run candle models on Linux x86_64, macOS arm64 or Windows x86_64, or serve GGUF with llamacpp"
            return [DoctorCheck(CHECK, "warn", why, fix)]
        installed = f" (mistralrs {version} is installed)" if version else ""
        return [DoctorCheck(CHECK, "fail", f"{why}{installed}", INSTALL_FIX)]
    if version != TESTED_VERSION:
        detail = f"mistralrs {version or 'of unknown version'} imports; the bridge is measured with {TESTED_VERSION}"
        return [DoctorCheck(CHECK, "warn", detail, INSTALL_FIX)]
    return [DoctorCheck(CHECK, "ok", f"mistralrs {version} imports")]

"""What ``werk doctor`` checks for oMLX (docs/cli.md, "werk doctor"; docs/plugin-kit.md,
"Doctor checks"; docs/omlx.md, "Versions and platforms").

* ``omlx.platform``: ``ok`` on macOS on Apple silicon; ``warn`` on Linux x86_64/aarch64, where
  MLX runs on its CPU build and the oMLX CLI is never used (it needs macOS on Apple silicon; the
  machine is not at fault); ``fail`` where MLX publishes no wheel.
* ``omlx.mlx``: the ``mlx`` and ``mlx-lm`` versions the Werk MLX worker's interpreter has (the
  ``omlx.python`` option, ``WERK_OMLX_PYTHON``, else this interpreter), read from package
  metadata without importing MLX; another interpreter answers a one-line metadata query
  bounded by :data:`PROBE_TIMEOUT_S`. ``fail`` when either is missing or outside the pinned
  :data:`werk_omlx.interpreter.SERIES`.
* ``omlx.cli`` (macOS on Apple silicon only): whether ``omlx`` is found (``warn`` when not: the
  worker serves instead).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

from werk_host.plugin import DoctorCheck, HostConfig

from .backend import PLUGIN_NAME
from .cli import ENV_EXECUTABLE, find_omlx
from .interpreter import ENV_PYTHON, SERIES, apple_silicon, mlx_platform, worker_python

PROBE_TIMEOUT_S = 15.0
INSTALL_FIX = f"pip install 'werk-omlx' (brings mlx and mlx-lm {SERIES}x: mlx[cpu] on Linux, mlx on Apple silicon)"
_QUERY = """
import importlib.metadata as m, json
out = {}
for name in ("mlx", "mlx-lm"):
    try:
        out[name] = m.version(name)
    except m.PackageNotFoundError:
        out[name] = None
print(json.dumps(out))
"""


def _platform() -> DoctorCheck:
    name = f"{PLUGIN_NAME}.platform"
    if apple_silicon():
        return DoctorCheck(name, "ok", "macOS on Apple silicon: MLX on Metal, and the oMLX CLI when installed")
    why = mlx_platform()
    if why is not None:
        return DoctorCheck(name, "fail", why, "run oMLX models on macOS on Apple silicon or on Linux x86_64/aarch64")
    return DoctorCheck(
        name,
        "warn",
        "the oMLX CLI needs macOS on Apple silicon; here the Werk MLX worker serves on MLX's CPU build",
        "nothing to do for the MLX worker; for omlx serve and Metal, use a Mac with Apple silicon",
    )


def _versions(python: Path) -> dict[str, str | None]:
    """``mlx``/``mlx-lm`` versions of ``python``; raises :class:`RuntimeError` saying why not."""
    if python == Path(sys.executable):
        found: dict[str, str | None] = {}
        for dist in ("mlx", "mlx-lm"):
            try:
                found[dist] = importlib.metadata.version(dist)
            except importlib.metadata.PackageNotFoundError:
                found[dist] = None
        return found
    try:
        done = subprocess.run(
            [str(python), "-c", _QUERY], stdin=subprocess.DEVNULL, capture_output=True, timeout=PROBE_TIMEOUT_S
        )
        raw = json.loads(done.stdout.decode().strip().splitlines()[-1])
    except subprocess.TimeoutExpired as err:
        raise RuntimeError(f"it did not answer within {PROBE_TIMEOUT_S:g}s") from err
    except (OSError, ValueError, IndexError) as err:
        raise RuntimeError("it could not be run") from err
    if not isinstance(raw, dict):
        raise RuntimeError("it could not be run")
    return {k: v if isinstance(v, str) else None for k, v in raw.items()}


def _mlx(config: HostConfig) -> DoctorCheck:
    name = f"{PLUGIN_NAME}.mlx"
    raw = config.backend_options.get(PLUGIN_NAME, {}).get("python")
    python = worker_python(str(raw) if raw else None)
    which = "the omlx.python option" if raw else ENV_PYTHON if os.environ.get(ENV_PYTHON) else "this interpreter"
    try:
        versions = _versions(python)
    except RuntimeError as err:
        return DoctorCheck(
            name,
            "fail",
            f"the MLX worker interpreter {python} ({which}): {err}",
            f"point {which} at a Python with werk-omlx",
        )
    missing = [dist for dist, v in versions.items() if v is None]
    if missing:
        return DoctorCheck(name, "fail", f"{' and '.join(missing)} not installed for {which}", INSTALL_FIX)
    mlx, mlx_lm = versions["mlx"] or "", versions["mlx-lm"] or ""
    if not (mlx.startswith(SERIES) and mlx_lm.startswith(SERIES)):
        detail = f"the worker needs mlx and mlx-lm {SERIES}x, {which} has mlx {mlx} and mlx-lm {mlx_lm}"
        return DoctorCheck(name, "fail", detail, f"pip install 'mlx-lm=={SERIES}*' 'mlx=={SERIES}*'")
    return DoctorCheck(name, "ok", f"mlx {mlx}, mlx-lm {mlx_lm} ({which})")


def _cli(config: HostConfig) -> DoctorCheck:
    name = f"{PLUGIN_NAME}.cli"
    raw = config.backend_options.get(PLUGIN_NAME, {}).get("executable")
    try:
        found = find_omlx(str(raw) if raw else None)
    except FileNotFoundError as err:
        return DoctorCheck(name, "fail", str(err), f"point {ENV_EXECUTABLE} (or omlx.executable) at an executable omlx")
    if found is None:
        return DoctorCheck(
            name,
            "warn",
            "no omlx found: the Werk MLX worker serves instead",
            f"put omlx on PATH or set {ENV_EXECUTABLE}",
        )
    return DoctorCheck(name, "ok", f"{found}")


def checks(config: HostConfig) -> list[DoctorCheck]:
    """The oMLX checks (see the module docstring)."""
    found = [_platform()]
    if mlx_platform() is None:
        found.append(_mlx(config))
    if apple_silicon():
        found.append(_cli(config))
    return found

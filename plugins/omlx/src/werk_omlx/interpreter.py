"""Which MLX runtime serves this plugin's models here, and why not when none does.

Two paths exist (docs/omlx.md):

* **the oMLX CLI** (``omlx``), on macOS on Apple silicon only, found through the ``omlx.executable``
  backend option, ``WERK_OMLX`` or ``PATH``;
* **the Werk-owned MLX worker** (:mod:`werk_omlx.worker`), run by a Python interpreter that has
  MLX and mlx-lm 0.32.x: the ``omlx.python`` option, ``WERK_OMLX_PYTHON``, else this interpreter.

:func:`probe_interpreter` runs the interpreter once (cached by path, size and mtime) to read
MLX's and mlx-lm's versions without importing MLX into ``werk serve``. The outcome is a
:class:`MlxInterpreter` or a reason that names no path (paths go to the log only).
"""

from __future__ import annotations

import json
import logging
import os
import platform
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

ENV_PYTHON = "WERK_OMLX_PYTHON"
#: The mlx / mlx-lm series the worker is written against (it uses mlx-lm internals).
SERIES = "0.32."
PROBE_TIMEOUT_S = 120.0
_PROBE = """
import importlib.util, json, sys
out = {"werk_omlx": importlib.util.find_spec("werk_omlx") is not None}
try:
    import mlx.core as mx
    import mlx_lm
    out.update(mlx=mx.__version__, mlx_lm=mlx_lm.__version__, device=str(mx.default_device()))
except Exception as err:
    out["error"] = type(err).__name__
print(json.dumps(out))
"""


def mlx_platform() -> str | None:
    """Why MLX has no wheel for this platform, or ``None`` when it has one."""
    system, machine = sys.platform, platform.machine().lower()
    if system == "darwin" and machine == "arm64":
        return None
    if system.startswith("linux") and machine in ("x86_64", "amd64", "aarch64", "arm64"):
        return None
    return f"MLX publishes no wheel for {system}/{machine} (macOS on Apple silicon or Linux x86_64/aarch64 only)"


def apple_silicon() -> bool:
    return sys.platform == "darwin" and platform.machine().lower() == "arm64"


@dataclass(frozen=True)
class MlxInterpreter:
    """An interpreter that runs the worker: MLX and mlx-lm versions and the default device."""

    python: Path
    mlx: str
    mlx_lm: str
    device: str


class MlxUnavailable(Exception):
    """No MLX runtime here; ``reason`` names no path."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


_cache: dict[tuple[str, int, int], MlxInterpreter | MlxUnavailable] = {}
_cache_lock = threading.Lock()


def worker_python(explicit: str | None) -> Path:
    """The interpreter the worker runs under: the option, ``WERK_OMLX_PYTHON``, else this one."""
    raw = explicit or os.environ.get(ENV_PYTHON) or sys.executable
    return Path(raw).expanduser()


def probe_interpreter(python: Path) -> MlxInterpreter:
    """The MLX runtime of ``python`` (cached); raises :class:`MlxUnavailable` with the reason."""
    why = mlx_platform()
    if why is not None:
        raise MlxUnavailable(why)
    try:
        st = python.stat()
    except OSError as err:
        log.error("the MLX worker interpreter %s is not there: %s", python, err)
        raise MlxUnavailable("the configured MLX worker interpreter does not exist") from err
    key = (str(python), st.st_size, st.st_mtime_ns)
    with _cache_lock:
        known = _cache.get(key)
    if known is None:
        known = _probe(python)
        with _cache_lock:
            _cache[key] = known
    if isinstance(known, MlxUnavailable):
        raise known
    return known


def _probe(python: Path) -> MlxInterpreter | MlxUnavailable:
    try:
        done = subprocess.run(
            [str(python), "-c", _PROBE],
            capture_output=True,
            timeout=PROBE_TIMEOUT_S,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
            check=False,
        )
        found = json.loads(done.stdout.decode().strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as err:
        log.error("probing the MLX worker interpreter %s failed: %s", python, err)
        return MlxUnavailable("the MLX worker interpreter could not be run")
    if not isinstance(found, dict):
        return MlxUnavailable("the MLX worker interpreter could not be run")
    if "error" in found:
        log.warning("MLX does not import under %s (%s)", python, found["error"])
        return MlxUnavailable(
            "MLX and mlx-lm are not importable by the worker interpreter (install werk-omlx, which brings "
            "mlx[cpu] on Linux or mlx on Apple silicon, or set omlx.python)"
        )
    if not found.get("werk_omlx"):
        return MlxUnavailable("the worker interpreter does not have werk-omlx installed")
    mlx, mlx_lm = str(found.get("mlx", "")), str(found.get("mlx_lm", ""))
    if not (mlx.startswith(SERIES) and mlx_lm.startswith(SERIES)):
        return MlxUnavailable(
            f"the worker needs mlx and mlx-lm {SERIES}x (found mlx {mlx}, mlx-lm {mlx_lm}): its expert "
            "offload uses mlx-lm internals of that series"
        )
    return MlxInterpreter(python, mlx, mlx_lm, str(found.get("device", "")))


def clear_probe_cache() -> None:
    with _cache_lock:
        _cache.clear()

"""What ``werk doctor`` checks for vLLM (docs/cli.md, "werk doctor"; docs/plugin-kit.md,
"Doctor checks").

``vllm.executable``: the executable :func:`werk_vllm.executable.find_vllm` finds (the
``executable`` backend option, ``WERK_VLLM``, else ``vllm`` on ``PATH``) and its version, read
from the flag cache a start left under ``WERK_HOME/backends/vllm/flags`` when it matches the
executable, else from ``vllm --version`` bounded by :data:`VERSION_TIMEOUT_S` (``vllm serve
--help=all`` is not run: it takes seconds). ``ok`` with the version; ``fail`` when a configured
path is not an executable file or does not answer ``--version``; ``warn`` when none is installed:
Werk cannot start vLLM here, yet remote vLLM endpoints (the ``endpoint`` option) still work.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from werk_host.plugin import DoctorCheck, HostConfig

from .backend import PLUGIN_NAME
from .executable import ENV_VAR, ExecutableIdentity, VllmNotFound, _read_disk, find_vllm

#: Bound of the ``vllm --version`` run (vLLM imports torch first).
VERSION_TIMEOUT_S = 60.0
CHECK = f"{PLUGIN_NAME}.executable"
INSTALL_FIX = (
    f"install vLLM in its own virtualenv (`pip install vllm`), then set {ENV_VAR}=<that venv>/bin/vllm "
    "or put vllm on PATH"
)


def _cached_version(path: Path, home: Path) -> str | None:
    try:
        identity = ExecutableIdentity.of(path)
    except OSError:
        return None
    found = _read_disk(home / "backends" / "vllm" / "flags" / f"{identity.key}.json", identity)
    return found.version if found is not None and found.version else None


def _version(path: Path) -> str:
    """``vllm --version``'s last line; raises :class:`RuntimeError` saying why there is none."""
    try:
        done = subprocess.run(
            [str(path), "--version"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=VERSION_TIMEOUT_S,
            env={**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "NO_COLOR": "1"},
            check=False,
        )
    except subprocess.TimeoutExpired as err:
        raise RuntimeError(f"`vllm --version` did not answer within {VERSION_TIMEOUT_S:g}s") from err
    except OSError as err:
        raise RuntimeError(f"cannot run it ({err.strerror or type(err).__name__})") from err
    lines = [line.strip() for line in done.stdout.decode("utf-8", errors="replace").splitlines() if line.strip()]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"`vllm --version` failed (exit {done.returncode})")
    return lines[-1]


def checks(config: HostConfig) -> list[DoctorCheck]:
    """The vLLM check (see the module docstring)."""
    raw = config.backend_options.get(PLUGIN_NAME, {}).get("executable")
    explicit = str(raw) if raw else None
    configured = "the vllm.executable backend option" if explicit else ENV_VAR if os.environ.get(ENV_VAR) else None
    try:
        found = find_vllm(explicit)
    except VllmNotFound as err:
        if configured is not None:
            return [DoctorCheck(CHECK, "fail", str(err), f"point {configured} at an executable vllm, or {INSTALL_FIX}")]
        detail = f"no vllm on PATH and {ENV_VAR} is not set: Werk cannot start vLLM here (remote endpoints work)"
        return [DoctorCheck(CHECK, "warn", detail, INSTALL_FIX)]
    version = _cached_version(found, config.home)
    if version is None:
        try:
            version = _version(found)
        except RuntimeError as err:
            return [DoctorCheck(CHECK, "fail", f"{found}: {err}", f"repair that vLLM install, or {INSTALL_FIX}")]
    where = configured or "PATH"
    return [DoctorCheck(CHECK, "ok", f"{found} (vLLM {version}; from {where})")]

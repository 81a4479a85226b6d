"""What ``werk doctor`` checks for llama.cpp (docs/cli.md, "werk doctor"; docs/plugin-kit.md,
"Doctor checks").

* ``llamacpp.llama-server``: the executable :func:`werk_llamacpp.binary.find_llama_server`
  finds (the ``llama_server`` backend option, ``WERK_LLAMA_SERVER``, ``PATH``, then the build
  cache), inspected like a start would (:func:`werk_llamacpp.binary.inspect_executable`: its
  ``--help`` and ``--version``, each bounded by :data:`PROBE_TIMEOUT_S`). ``ok`` names the
  version and where it was found; ``fail`` when a configured path is not an executable file,
  when it does not run, or when none is found, each with the fix (``werk llamacpp build`` or
  ``WERK_LLAMA_SERVER=/path/to/llama-server``).
* ``llamacpp.flags``: the flags Werk generates (:data:`REQUIRED_FLAGS`) are all advertised by
  that executable's ``--help`` (``fail`` names the missing ones), and the optional ones Werk uses
  when present (:data:`OPTIONAL_FLAGS`) are reported ``warn`` when absent.

Nothing here loads a model or starts a server.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from werk_host.plugin import DoctorCheck, HostConfig

from .binary import (
    ENV_VAR,
    BinaryInfo,
    InspectionError,
    LlamaServerNotFound,
    build_cache_root,
    find_llama_server,
    inspect_executable,
)
from .core import PLUGIN_NAME
from .reasoning import BUDGET_FLAG

#: Bound of each ``--help``/``--version`` run.
PROBE_TIMEOUT_S = 15.0
#: The flags Werk passes every llama-server it starts (werk_llamacpp/process.py).
REQUIRED_FLAGS = ("--host", "--port", "-m", "-np", "-c", "--slot-save-path")
#: Flags Werk uses when advertised: /metrics, the model alias, reasoning budgets.
OPTIONAL_FLAGS = ("--metrics", "--alias", BUDGET_FLAG)

SERVER_CHECK = f"{PLUGIN_NAME}.llama-server"
FLAGS_CHECK = f"{PLUGIN_NAME}.flags"
BUILD_FIX = f"run `werk llamacpp build` (builds and caches llama-server), or set {ENV_VAR}=/path/to/llama-server"


def _source(found: Path, explicit: str | None) -> str:
    if explicit:
        return "the llama_server backend option"
    if os.environ.get(ENV_VAR):
        return ENV_VAR
    on_path = shutil.which("llama-server")
    if on_path and Path(on_path).absolute() == found:
        return "PATH"
    return "the build cache"


def _flag_check(info: BinaryInfo) -> DoctorCheck:
    missing = [f for f in REQUIRED_FLAGS if not info.advertises(f)]
    if missing:
        return DoctorCheck(
            FLAGS_CHECK,
            "fail",
            f"llama-server does not advertise {', '.join(missing)}, which Werk passes it",
            f"use a newer llama-server: {BUILD_FIX}",
        )
    absent = [f for f in OPTIONAL_FLAGS if not info.advertises(f)]
    if absent:
        return DoctorCheck(
            FLAGS_CHECK,
            "warn",
            f"every flag Werk needs is advertised; {', '.join(absent)} not (used when present)",
            f"for those features use a newer llama-server: {BUILD_FIX}",
        )
    return DoctorCheck(FLAGS_CHECK, "ok", f"advertises every flag Werk uses ({len(info.flags)} flags in --help)")


def checks(config: HostConfig) -> list[DoctorCheck]:
    """The llama.cpp checks (see the module docstring)."""
    raw = config.backend_options.get(PLUGIN_NAME, {}).get("llama_server")
    explicit = str(raw) if raw else None
    try:
        found = find_llama_server(explicit)
    except LlamaServerNotFound as err:
        if explicit or os.environ.get(ENV_VAR):
            where = "the llama_server backend option" if explicit else ENV_VAR
            fix = f"point {where} at an executable llama-server (chmod +x it), or {BUILD_FIX}"
            return [DoctorCheck(SERVER_CHECK, "fail", str(err), fix)]
        detail = f"no llama-server on PATH or in the build cache ({build_cache_root()}), and {ENV_VAR} is not set"
        return [DoctorCheck(SERVER_CHECK, "fail", detail, BUILD_FIX)]
    try:
        info = inspect_executable(found, timeout=PROBE_TIMEOUT_S)
    except (InspectionError, OSError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        return [DoctorCheck(SERVER_CHECK, "fail", f"{found} does not run: {first}", BUILD_FIX)]
    version = info.version_text.splitlines()[0].removeprefix("version: ") if info.version_text else "version unknown"
    where = _source(found, explicit)
    return [DoctorCheck(SERVER_CHECK, "ok", f"{found} ({version}; from {where})"), _flag_check(info)]

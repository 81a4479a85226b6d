"""werk-onnx-genai's plugin module: the entry point ``werk: onnx-genai`` names it.

It offers the collected hooks only, the adapter factory and the doctor checks; every operation
is a method of :class:`werk_onnx_genai.adapter.OnnxGenaiAdapter` (docs/plugin-hooks.md).
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path

from pydantic import JsonValue

from werk_host.plugin import AdapterFactory, DoctorCheck, HostConfig, hookimpl

from .adapter import BACKEND_ID, REPORTED, accepts, create_adapter
from .settings import CACHE_SIZE_ENV, PYTHON_ENV, cache_size, parse_options

__all__ = ["PLUGIN_NAME", "werk_adapter_factories", "werk_doctor_checks"]

PLUGIN_NAME = BACKEND_ID
SETUP_FIX = f"run `bash scripts/setup-engine-venv.sh onnx-genai` and set {PYTHON_ENV} to the path it prints"
PROBE = (
    "import importlib.metadata as m, sys\n"
    "print(' '.join(f'{d} {m.version(d)}' for d in ('onnxruntime-genai', 'onnxruntime')))"
)


def _validate_options(options: Mapping[str, JsonValue]) -> None:
    """A profile instance's options, checked when ``werk serve`` starts (docs/plugin-kit.md,
    "Options"); raises :class:`ValueError` naming the option."""
    parse_options(options)


@hookimpl
def werk_adapter_factories(config: HostConfig) -> list[AdapterFactory]:
    return [
        AdapterFactory(
            BACKEND_ID,
            accepts,
            create_adapter,
            "ONNX Runtime GenAI model directories in a Werk-owned CPU worker per exact model",
            REPORTED,
            validate_options=_validate_options,
        )
    ]


@hookimpl
def werk_doctor_checks(config: HostConfig) -> list[DoctorCheck]:
    checks: list[DoctorCheck] = []
    try:
        settings = parse_options(config.backend_options.get(BACKEND_ID, {}))
        size = cache_size()
    except ValueError as err:
        return [DoctorCheck(f"{BACKEND_ID}.options", "fail", str(err), "fix the onnx-genai options or environment")]
    checks.append(DoctorCheck(f"{BACKEND_ID}.model_cache", "ok", f"{CACHE_SIZE_ENV}: {size} loaded model(s) at most"))
    if settings.python is None:
        checks.append(DoctorCheck(f"{BACKEND_ID}.engine", "warn", f"{PYTHON_ENV} is not set", SETUP_FIX))
        return checks
    if not Path(settings.python).is_file():
        checks.append(DoctorCheck(f"{BACKEND_ID}.engine", "fail", f"{PYTHON_ENV} names no file", SETUP_FIX))
        return checks
    try:
        probe = subprocess.run([settings.python, "-c", PROBE], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        checks.append(
            DoctorCheck(
                f"{BACKEND_ID}.engine", "fail", f"the interpreter did not answer ({type(err).__name__})", SETUP_FIX
            )
        )
        return checks
    if probe.returncode != 0:
        checks.append(
            DoctorCheck(f"{BACKEND_ID}.engine", "fail", "onnxruntime-genai is not installed there", SETUP_FIX)
        )
    else:
        checks.append(DoctorCheck(f"{BACKEND_ID}.engine", "ok", probe.stdout.strip()))
    return checks

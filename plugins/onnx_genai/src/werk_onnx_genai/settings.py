"""The ONNX GenAI backend's settings (docs/onnx-genai.md, "Settings").

* ``onnx-genai.python`` (option) or ``WERK_ONNX_GENAI_PYTHON`` (environment): the interpreter of
  the engine virtualenv (``scripts/setup-engine-venv.sh onnx-genai`` prints it).
* ``startup_timeout``: seconds to wait for a worker to load its model (default 300).
* ``WERK_ONNX_GENAI_MODEL_CACHE_SIZE``: how many models may be loaded at once, at least 1
  (default 1, the seed's bound).

Unknown option names and wrong values raise :class:`ValueError` naming the option, never its
value; the factory's ``validate_options`` turns that into a refused profile.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from pydantic import JsonValue

__all__ = ["CACHE_SIZE_ENV", "PYTHON_ENV", "Settings", "cache_size", "parse_options"]

PYTHON_ENV = "WERK_ONNX_GENAI_PYTHON"
CACHE_SIZE_ENV = "WERK_ONNX_GENAI_MODEL_CACHE_SIZE"


@dataclass(frozen=True)
class Settings:
    python: str | None
    startup_timeout: float = 300.0


def parse_options(options: Mapping[str, JsonValue], env: Mapping[str, str] | None = None) -> Settings:
    environ = os.environ if env is None else env
    unknown = sorted(set(options) - {"python", "startup_timeout"})
    if unknown:
        raise ValueError(f"unknown option {unknown[0]} (known: python, startup_timeout)")
    python = options.get("python", environ.get(PYTHON_ENV) or None)
    if python is not None and (not isinstance(python, str) or not python):
        raise ValueError("python must be a path to the engine virtualenv's interpreter")
    timeout = options.get("startup_timeout", 300)
    if not isinstance(timeout, int | float) or isinstance(timeout, bool) or not 1 <= timeout <= 3600:
        raise ValueError("startup_timeout must be a number of seconds from 1 to 3600")
    return Settings(python, float(timeout))


def cache_size(env: Mapping[str, str] | None = None) -> int:
    raw = (os.environ if env is None else env).get(CACHE_SIZE_ENV, "").strip()
    if not raw:
        return 1
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{CACHE_SIZE_ENV} must be a positive integer")
    return int(raw)

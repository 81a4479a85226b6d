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

from collections.abc import Mapping
from dataclasses import dataclass

from pydantic import JsonValue

from werk_host.plugin.engines import engine_options, model_cache_size

__all__ = ["CACHE_SIZE_ENV", "PYTHON_ENV", "Settings", "cache_size", "parse_options"]

PYTHON_ENV = "WERK_ONNX_GENAI_PYTHON"
CACHE_SIZE_ENV = "WERK_ONNX_GENAI_MODEL_CACHE_SIZE"


@dataclass(frozen=True)
class Settings:
    python: str | None
    startup_timeout: float = 300.0


def parse_options(options: Mapping[str, JsonValue], env: Mapping[str, str] | None = None) -> Settings:
    return Settings(*engine_options(options, PYTHON_ENV, env))


def cache_size(env: Mapping[str, str] | None = None) -> int:
    return model_cache_size(CACHE_SIZE_ENV, env)

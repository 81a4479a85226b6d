"""The Qwen3-TTS backend's settings: per-instance options, the engine interpreter and the model
LRU's capacity (docs/media.md, "Speech").

* ``qwen-tts.python`` (option) or ``WERK_QWEN_TTS_PYTHON`` (environment): the interpreter of the
  engine virtualenv (``scripts/setup-engine-venv.sh qwen-tts`` prints it).
* ``device``: ``auto`` (CUDA when torch sees one, else CPU; the default), ``cpu``, ``cuda``,
  ``cuda:N``; ``threads``: torch's CPU threads (0: torch's default); ``startup_timeout``:
  seconds to wait for the worker to start (default 300).
* ``WERK_MEDIA_PIPELINE_CACHE_SIZE``: how many models the Qwen worker keeps loaded at once, at
  least 1 (default 1). The seed's bound applies to the generic media worker and to this one
  independently: each worker has its own LRU of that capacity. A value that is not a positive
  integer is refused when the backend starts.

Unknown option names and wrong values raise :class:`ValueError` naming the option (never its
value), which the factory's ``validate_options`` turns into a refused profile.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pydantic import JsonValue

from werk_host.plugin.engines import engine_options, model_cache_size, torch_runtime

__all__ = ["CACHE_SIZE_ENV", "PYTHON_ENV", "Settings", "cache_size", "parse_options"]

PYTHON_ENV = "WERK_QWEN_TTS_PYTHON"
CACHE_SIZE_ENV = "WERK_MEDIA_PIPELINE_CACHE_SIZE"


@dataclass(frozen=True)
class Settings:
    python: str | None
    device: str = "auto"
    threads: int = 0
    startup_timeout: float = 300.0


def parse_options(options: Mapping[str, JsonValue], env: Mapping[str, str] | None = None) -> Settings:
    python, timeout = engine_options(options, PYTHON_ENV, env, extra=("device", "threads"))
    device, threads = torch_runtime(options)
    return Settings(python, device, threads, timeout)


def cache_size(env: Mapping[str, str] | None = None) -> int:
    return model_cache_size(CACHE_SIZE_ENV, env)

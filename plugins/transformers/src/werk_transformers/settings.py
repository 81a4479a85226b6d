"""The transformers backend's settings: per-instance options, the engine interpreter and the
model LRU's capacity (docs/transformers.md, "Settings").

* ``transformers.python`` (option) or ``WERK_TRANSFORMERS_PYTHON`` (environment): the
  interpreter of the engine virtualenv (``scripts/setup-engine-venv.sh transformers`` prints it).
* ``device``: ``auto`` (CUDA when torch sees one, else CPU; the default), ``cpu``, ``cuda``,
  ``cuda:N``; ``dtype``: ``auto`` (the checkpoint's), ``float32``, ``float16``, ``bfloat16``;
  ``threads``: torch's CPU threads (0: torch's default); ``startup_timeout``: seconds to wait
  for a worker to load its model (default 300).
* ``WERK_TRANSFORMERS_MODEL_CACHE_SIZE``: how many models may be loaded at once, at least 1
  (default 1, the seed's bound). A value that is not a positive integer is refused when the
  backend starts.

Unknown option names and wrong values raise :class:`ValueError` naming the option (never its
value), which the factory's ``validate_options`` turns into a refused profile.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from pydantic import JsonValue

__all__ = ["CACHE_SIZE_ENV", "PYTHON_ENV", "Settings", "cache_size", "parse_options"]

PYTHON_ENV = "WERK_TRANSFORMERS_PYTHON"
CACHE_SIZE_ENV = "WERK_TRANSFORMERS_MODEL_CACHE_SIZE"
DEVICE_RE = re.compile(r"auto|cpu|cuda(:\d{1,2})?")
DTYPES = ("auto", "float32", "float16", "bfloat16")


@dataclass(frozen=True)
class Settings:
    python: str | None
    device: str = "auto"
    dtype: str = "auto"
    threads: int = 0
    startup_timeout: float = 300.0


def parse_options(options: Mapping[str, JsonValue], env: Mapping[str, str] | None = None) -> Settings:
    environ = os.environ if env is None else env
    unknown = sorted(set(options) - {"python", "device", "dtype", "threads", "startup_timeout"})
    if unknown:
        raise ValueError(f"unknown option {unknown[0]} (known: python, device, dtype, threads, startup_timeout)")
    python = options.get("python", environ.get(PYTHON_ENV) or None)
    if python is not None and (not isinstance(python, str) or not python):
        raise ValueError("python must be a path to the engine virtualenv's interpreter")
    device = options.get("device", "auto")
    if not isinstance(device, str) or not DEVICE_RE.fullmatch(device):
        raise ValueError("device must be auto, cpu, cuda or cuda:N")
    dtype = options.get("dtype", "auto")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}")
    threads = options.get("threads", 0)
    if not isinstance(threads, int) or isinstance(threads, bool) or not 0 <= threads <= 1024:
        raise ValueError("threads must be an integer from 0 to 1024")
    timeout = options.get("startup_timeout", 300)
    if not isinstance(timeout, int | float) or isinstance(timeout, bool) or not 1 <= timeout <= 3600:
        raise ValueError("startup_timeout must be a number of seconds from 1 to 3600")
    assert isinstance(dtype, str)
    return Settings(python, device, dtype, threads, float(timeout))


def cache_size(env: Mapping[str, str] | None = None) -> int:
    raw = (os.environ if env is None else env).get(CACHE_SIZE_ENV, "").strip()
    if not raw:
        return 1
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{CACHE_SIZE_ENV} must be a positive integer")
    return int(raw)

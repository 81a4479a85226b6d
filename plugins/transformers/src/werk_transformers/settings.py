"""The transformers backend's settings: per-instance options, the engine interpreter and the
model LRU's capacity (docs/transformers.md, "Settings").

* ``transformers.python`` (option) or ``WERK_TRANSFORMERS_PYTHON`` (environment): the
  interpreter of the engine virtualenv (``scripts/setup-engine-venv.sh transformers`` prints it).
* ``device``: ``auto`` (CUDA when torch sees one, else CPU; the default), ``cpu``, ``cuda``,
  ``cuda:N``; ``dtype``: ``auto`` (the checkpoint's), ``float32``, ``float16``, ``bfloat16``;
  ``threads``: torch's CPU threads (0: torch's default); ``startup_timeout``: seconds to wait
  for a worker to load its model (default 300).
* ``pooling``: ``mean`` or ``cls`` makes the instance an embedding instance (docs/transformers.md,
  "Embeddings"); unset, an evidently encoder checkpoint is one with ``mean`` pooling
  (:func:`werk_transformers.embeddings.instance_pooling`) and any other a chat instance.
* ``WERK_TRANSFORMERS_MODEL_CACHE_SIZE``: how many models may be loaded at once, at least 1
  (default 1, the seed's bound). A value that is not a positive integer is refused when the
  backend starts.

Unknown option names and wrong values raise :class:`ValueError` naming the option (never its
value), which the factory's ``validate_options`` turns into a refused profile.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pydantic import JsonValue

from werk_host.plugin.engines import engine_options, model_cache_size, torch_runtime

__all__ = ["CACHE_SIZE_ENV", "POOLINGS", "PYTHON_ENV", "Settings", "cache_size", "parse_options"]

PYTHON_ENV = "WERK_TRANSFORMERS_PYTHON"
CACHE_SIZE_ENV = "WERK_TRANSFORMERS_MODEL_CACHE_SIZE"
DTYPES = ("auto", "float32", "float16", "bfloat16")
#: An embedding instance's poolings of the last hidden state (docs/transformers.md, "Embeddings").
POOLINGS = ("mean", "cls")


@dataclass(frozen=True)
class Settings:
    python: str | None
    device: str = "auto"
    dtype: str = "auto"
    threads: int = 0
    startup_timeout: float = 300.0
    #: ``None``: not set (the checkpoint decides, :func:`werk_transformers.embeddings.instance_pooling`).
    pooling: str | None = None


def parse_options(options: Mapping[str, JsonValue], env: Mapping[str, str] | None = None) -> Settings:
    python, timeout = engine_options(options, PYTHON_ENV, env, extra=("device", "dtype", "threads", "pooling"))
    device, threads = torch_runtime(options)
    dtype = options.get("dtype", "auto")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}")
    assert isinstance(dtype, str)
    pooling = options.get("pooling")
    if "pooling" in options and pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}")
    assert pooling is None or isinstance(pooling, str)
    return Settings(python, device, dtype, threads, timeout, pooling)


def cache_size(env: Mapping[str, str] | None = None) -> int:
    return model_cache_size(CACHE_SIZE_ENV, env)

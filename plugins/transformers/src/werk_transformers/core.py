"""What the transformers backend's chat and embedding adapters share: the backend id, the
worker script, the one worker pool (the model LRU, docs/transformers.md, "Workers and the model
LRU") and the capability ids the plugin declares."""

from __future__ import annotations

from pathlib import Path
from typing import Final

from werk_host.plugin import CapabilityId
from werk_host.plugin.engines import REPORTED as ENGINE_REPORTED
from werk_host.plugin.pool import WorkerPool

from .settings import cache_size

__all__ = ["BACKEND_ID", "KEY_ENV", "POOL", "REPORTED", "WORKER"]

BACKEND_ID: Final = "transformers"
WORKER: Final = Path(__file__).with_name("worker.py")
#: The environment variable that carries a worker's key (worker.py reads the same name).
KEY_ENV: Final = "WERK_TRANSFORMERS_WORKER_KEY"
#: Chat and embedding workers alike: at most WERK_TRANSFORMERS_MODEL_CACHE_SIZE loaded at once.
POOL: Final = WorkerPool(cache_size)
#: The kit's engine capabilities, and ``api.embeddings`` / ``api.rerank`` (docs/transformers.md).
REPORTED: Final = (*ENGINE_REPORTED, CapabilityId.EMBEDDINGS, CapabilityId.RERANK)

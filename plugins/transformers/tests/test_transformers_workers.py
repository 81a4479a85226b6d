"""Workers on the real engine, the kit's engine-worker rules (``werk_host.testing.engines``): one
per exact model (checksum-sensitive), shared by adapters of the same model, bounded by
WERK_TRANSFORMERS_MODEL_CACHE_SIZE (least recently used idle worker stopped first), serialized,
streaming with usage equal to the exact count; a forced tool call refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from werk_transformers.adapter import create_adapter
from werk_transformers.settings import CACHE_SIZE_ENV, PYTHON_ENV
from werk_transformers.testing import tiny_checkpoint

from werk_host.plugin.checkpoints import checkpoint_manifest
from werk_host.testing.engines import EngineWorkerSuite, EngineWorkerTarget

pytestmark = pytest.mark.engine


class TestWorkers(EngineWorkerSuite):
    @pytest.fixture
    def engine_worker_target(self, engine: str, checkpoint: Path) -> EngineWorkerTarget:
        return EngineWorkerTarget(
            create=create_adapter,
            manifest=checkpoint_manifest,
            model=checkpoint,
            other_model=lambda: tiny_checkpoint(engine, seed=1),
            config_file="config.json",
            backend_options={"transformers": {"python": engine, "threads": 1}},
            cache_size_env=CACHE_SIZE_ENV,
            python_env=PYTHON_ENV,
        )

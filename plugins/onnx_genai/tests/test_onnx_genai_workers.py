"""Workers on the real engine (a new generator per request, nothing shared between requests), the
kit's engine-worker rules (``werk_host.testing.engines``): one per exact model
(checksum-sensitive), shared by adapters of the same model, bounded by
WERK_ONNX_GENAI_MODEL_CACHE_SIZE (least recently used idle worker stopped first), serialized,
streaming with usage equal to the exact count; a forced tool call refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from werk_onnx_genai.adapter import create_adapter, genai_dir
from werk_onnx_genai.settings import CACHE_SIZE_ENV, PYTHON_ENV
from werk_onnx_genai.testing import tiny_genai_model

from werk_host.plugin import ModelManifest
from werk_host.plugin.checkpoints import checkpoint_files
from werk_host.testing.engines import EngineWorkerSuite, EngineWorkerTarget

pytestmark = pytest.mark.engine


def _manifest(directory: Path, name: str) -> ModelManifest:
    manifest = ModelManifest.from_paths(name, checkpoint_files(directory))
    assert genai_dir(manifest) == directory
    return manifest


class TestWorkers(EngineWorkerSuite):
    @pytest.fixture
    def engine_worker_target(self, engine: str, genai_model: Path) -> EngineWorkerTarget:
        return EngineWorkerTarget(
            create=create_adapter,
            manifest=_manifest,
            model=genai_model,
            other_model=lambda: tiny_genai_model(engine, seed=1),
            config_file="genai_config.json",
            backend_options={"onnx-genai": {"python": engine}},
            cache_size_env=CACHE_SIZE_ENV,
            python_env=PYTHON_ENV,
        )

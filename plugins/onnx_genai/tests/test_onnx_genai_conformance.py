"""The whole Werk conformance suite on the real engine: onnxruntime-genai (CPU) in the plugin's
worker, serving a tiny random Llama converted by onnxruntime_genai.models.builder."""

from __future__ import annotations

from pathlib import Path

import pytest

from werk_host.plugin import ModelManifest
from werk_host.plugin.checkpoints import checkpoint_files
from werk_host.testing.conformance import ConformanceTarget, WerkConformance
from werk_host.testing.engines import restart_worker

pytestmark = pytest.mark.engine


class TestConformance(WerkConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def conformance_target(cls, genai_model: Path, engine: str) -> ConformanceTarget:
        return ConformanceTarget(
            entry_point="onnx-genai",
            # A GenAI directory is not a Hugging Face checkpoint: its files make the manifest.
            model=ModelManifest.from_paths("conformance-model", checkpoint_files(genai_model)),
            model_name="conformance-model",
            replace_process=restart_worker,
            backend_options={"onnx-genai": {"python": engine}},
        )

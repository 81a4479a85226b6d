"""The whole Werk conformance suite against the real engine (generated tiny model)."""

from __future__ import annotations

from pathlib import Path

import pytest

from werk_host.plugin import ModelManifest
from werk_host.testing.conformance import ConformanceTarget, WerkConformance

pytestmark = pytest.mark.engine


class TestConformance(WerkConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def conformance_target(cls, tiny_gguf: Path) -> ConformanceTarget:
        manifest = ModelManifest.from_paths("tiny-candle", [tiny_gguf], backend="candle")
        return ConformanceTarget(entry_point="candle", model=manifest)

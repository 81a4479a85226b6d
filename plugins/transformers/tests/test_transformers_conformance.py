"""The whole Werk conformance suite on the real engine: transformers on torch (CPU here) in the
plugin's worker, serving a tiny random-weight Llama checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest

from werk_host.testing.conformance import ConformanceTarget, WerkConformance
from werk_host.testing.engines import restart_worker

pytestmark = pytest.mark.engine


class TestConformance(WerkConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def conformance_target(cls, checkpoint: Path, engine: str) -> ConformanceTarget:
        return ConformanceTarget(
            entry_point="transformers",
            model=checkpoint,
            replace_process=restart_worker,
            backend_options={"transformers": {"python": engine, "device": "cpu", "threads": 1}},
        )

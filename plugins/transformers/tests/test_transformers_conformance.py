"""The whole Werk conformance suite on the real engine: transformers on torch (CPU here) in the
plugin's worker, serving a tiny random-weight Llama checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
from werk_transformers.adapter import TransformersAdapter

from werk_host.plugin import Adapter
from werk_host.testing.conformance import ConformanceTarget, WerkConformance

pytestmark = pytest.mark.engine


def replace(adapter: Adapter) -> None:
    """Kill the worker and start a new one (a new process generation)."""
    assert isinstance(adapter, TransformersAdapter)
    adapter.restart()


class TestConformance(WerkConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def conformance_target(cls, checkpoint: Path, engine: str) -> ConformanceTarget:
        return ConformanceTarget(
            entry_point="transformers",
            model=checkpoint,
            replace_process=replace,
            backend_options={"transformers": {"python": engine, "device": "cpu", "threads": 1}},
        )

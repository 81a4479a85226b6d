"""Fixtures for werk-candle-bridge tests.

Tests marked ``engine`` run the real mistralrs engine in this process. Where the engine is not
installed (no mistralrs wheel for the platform) they are skipped with the plugin's own reason,
which is also what the plugin reports as ``unavailable``.

Models: ``tiny_gguf`` is a generated random-weight llama GGUF (``werk_llamacpp.testing.testmodel``;
mistralrs loads it and generates nonsense, fast), for tests of mechanics; ``smollm2_gguf``
(the kit's fixture) is the real SmolLM2-135M-Instruct, for its chat template, coherent text and
real memory. Prompts stay short: the engine prefills SmolLM2 at a few tokens per second here.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from werk_candle_bridge.engine import missing_engine_reason
from werk_llamacpp.testing.testmodel import generate_model


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "engine: needs the mistralrs engine (skipped where it has no wheel)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = missing_engine_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if item.get_closest_marker("engine") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The generated test model (64-dim, 2 layers, SPM byte-fallback vocabulary, ChatML template)."""
    return generate_model(tmp_path_factory.mktemp("tiny") / "tiny.gguf")

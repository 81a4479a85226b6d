"""Fixtures: the engine interpreter (``WERK_QWEN_TTS_PYTHON``, which ``scripts/test.sh`` sets
from ``scripts/setup-engine-venv.sh qwen-tts``), the cached tiny model folders and the adapters
a test made (closed after it).

Tests that run the real engine are marked ``engine`` and skip, naming the variable, where it is
unset: the set-up script skips platforms its pinned CPU wheels cannot run on."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from werk_qwen_tts.adapter import POOL, QwenTtsAdapter, create_adapter
from werk_qwen_tts.settings import PYTHON_ENV
from werk_qwen_tts.testing.models import tiny_model

from werk_host.plugin import HostConfig
from werk_host.plugin.checkpoints import checkpoint_manifest
from werk_host.testing.engines import engine_python, skip_without_engine


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    skip_without_engine(items, PYTHON_ENV, "scripts/setup-engine-venv.sh qwen-tts")


@pytest.fixture(scope="session")
def engine() -> str:
    python = engine_python(PYTHON_ENV)
    assert python is not None
    return python


@pytest.fixture(scope="session")
def model(engine: str) -> Path:
    return tiny_model(engine)


@pytest.fixture(scope="session")
def design_model(engine: str) -> Path:
    return tiny_model(engine, kind="voice_design")


@pytest.fixture
def config(tmp_path: Path, engine: str) -> HostConfig:
    return HostConfig(home=tmp_path / "home", backend_options={"qwen-tts": {"python": engine, "threads": 1}})


@pytest.fixture
def make(config: HostConfig) -> Iterator[Callable[..., QwenTtsAdapter]]:
    made: list[QwenTtsAdapter] = []

    def build(folder: Path, name: str = "tiny-tts") -> QwenTtsAdapter:
        adapter = create_adapter(config, checkpoint_manifest(folder, name))
        made.append(adapter)
        return adapter

    yield build
    for adapter in made:
        adapter.close()


@pytest.fixture(autouse=True, scope="session")
def _no_workers_left() -> Iterator[None]:
    yield
    assert POOL.loaded() == 0, "a test left a Qwen3-TTS worker running"

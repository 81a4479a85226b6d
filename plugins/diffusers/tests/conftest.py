"""Fixtures: the engine interpreter (``WERK_DIFFUSERS_PYTHON``, which ``scripts/test.sh`` sets
from ``scripts/setup-engine-venv.sh diffusers``), the cached tiny pipeline folders and the
adapters a test made (closed after it).

Tests that run the real engine are marked ``engine`` and skip, naming the variable, where it is
unset: the set-up script skips platforms its pinned CPU wheels cannot run on."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from werk_diffusers.adapter import POOL, DiffusersAdapter, create_adapter
from werk_diffusers.settings import PYTHON_ENV
from werk_diffusers.testing import tiny_pipeline

from werk_host.plugin import HostConfig
from werk_host.plugin.checkpoints import checkpoint_manifest
from werk_host.testing.engines import engine_python, skip_without_engine


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    skip_without_engine(items, PYTHON_ENV, "scripts/setup-engine-venv.sh diffusers")


@pytest.fixture(scope="session")
def engine() -> str:
    python = engine_python(PYTHON_ENV)
    assert python is not None
    return python


@pytest.fixture(scope="session")
def pipeline(engine: str) -> Path:
    return tiny_pipeline(engine)


@pytest.fixture(scope="session")
def other_pipeline(engine: str) -> Path:
    return tiny_pipeline(engine, seed=1)


@pytest.fixture
def config(tmp_path: Path, engine: str) -> HostConfig:
    return HostConfig(home=tmp_path / "home", backend_options={"diffusers": {"python": engine, "threads": 1}})


@pytest.fixture
def make(config: HostConfig) -> Iterator[Callable[..., DiffusersAdapter]]:
    made: list[DiffusersAdapter] = []

    def build(folder: Path, name: str = "tiny") -> DiffusersAdapter:
        adapter = create_adapter(config, checkpoint_manifest(folder, name))
        made.append(adapter)
        return adapter

    yield build
    for adapter in made:
        adapter.close()


@pytest.fixture(autouse=True, scope="session")
def _no_workers_left() -> Iterator[None]:
    yield
    assert POOL.loaded() == 0, "a test left a diffusers worker running"

"""Fixtures: the engine interpreter (``WERK_TRANSFORMERS_PYTHON``, which ``scripts/test.sh``
sets from ``scripts/setup-engine-venv.sh transformers``) and the cached tiny checkpoint.

Tests that run the real engine are marked ``engine`` and skip, naming the variable, where it is
unset: the set-up script skips platforms its pinned CPU wheels cannot run on."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from werk_transformers.adapter import POOL
from werk_transformers.settings import PYTHON_ENV
from werk_transformers.testing import tiny_checkpoint

from werk_host.testing.engines import engine_python, skip_without_engine


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    skip_without_engine(items, PYTHON_ENV, "scripts/setup-engine-venv.sh transformers")


@pytest.fixture(scope="session")
def engine() -> str:
    python = engine_python(PYTHON_ENV)
    assert python is not None
    return python


@pytest.fixture(scope="session")
def checkpoint(engine: str) -> Path:
    return tiny_checkpoint(engine)


@pytest.fixture(autouse=True, scope="session")
def _no_workers_left() -> Iterator[None]:
    yield
    assert POOL.loaded() == 0, "a test left a transformers worker running"

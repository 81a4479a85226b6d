"""Fixtures: the engine interpreter (``WERK_ONNX_GENAI_PYTHON``, which ``scripts/test.sh``
sets from ``scripts/setup-engine-venv.sh onnx-genai``) and the cached tiny GenAI model (built
from the tiny checkpoint).

Tests that run the real engine are marked ``engine`` and skip, naming the variable, where it is
unset: the set-up script skips platforms its pinned CPU wheels cannot run on."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from werk_onnx_genai.adapter import POOL
from werk_onnx_genai.settings import PYTHON_ENV
from werk_onnx_genai.testing import tiny_genai_model

from werk_host.testing.engines import engine_python, skip_without_engine


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    skip_without_engine(items, PYTHON_ENV, "scripts/setup-engine-venv.sh onnx-genai")


@pytest.fixture(scope="session")
def engine() -> str:
    python = engine_python(PYTHON_ENV)
    assert python is not None
    return python


@pytest.fixture(scope="session")
def genai_model(engine: str) -> Path:
    return tiny_genai_model(engine)


@pytest.fixture(autouse=True, scope="session")
def _no_workers_left() -> Iterator[None]:
    yield
    assert POOL.loaded() == 0, "a test left an ONNX GenAI worker running"

"""Fixtures for runtime-state store tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from werk_host.store import StateStore

from .helpers import FakeClock


@pytest.fixture
def werk_home_dir(tmp_path: Path) -> Path:
    path = tmp_path / "werk-home"
    path.mkdir()
    return path


@pytest.fixture
def root(werk_home_dir: Path) -> Path:
    return werk_home_dir / "runtime-state" / "v1"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_store(root: Path, clock: FakeClock) -> Callable[..., StateStore]:
    def make(**kw: Any) -> StateStore:
        kw.setdefault("clock", clock)
        return StateStore(root, **kw)

    return make


@pytest.fixture
def store(make_store: Callable[..., StateStore]) -> StateStore:
    return make_store()


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory outside WERK_HOME holding a canary file."""
    path = tmp_path / "outside"
    path.mkdir()
    (path / "canary.txt").write_bytes(b"do not touch")
    return path

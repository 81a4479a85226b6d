"""Fixtures of the chat tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from werk_host.testing.hosts import install_model


@pytest.fixture
def home(werk_home: Path) -> Path:
    install_model(werk_home)
    return werk_home

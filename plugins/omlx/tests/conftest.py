"""Fixtures for werk-omlx tests.

Tests marked ``mlx`` need MLX and mlx-lm importable here (Linux x86_64/aarch64 with
``mlx[cpu]``, or macOS on Apple silicon); werk-omlx's own dependencies install them where
wheels exist, and elsewhere those tests are skipped with that reason. The MoE fixtures are
random-weight ``qwen3_moe`` checkpoints written once per session by :mod:`werk_omlx.testing.testmodel`
(float32 in the per-expert Hugging Face layout, and its 4-bit conversion by mlx-lm).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest
from werk_omlx.adapter import ENV_BUDGET
from werk_omlx.interpreter import ENV_PYTHON, mlx_platform
from werk_omlx.testing.testmodel import TINY, generate

from werk_host.plugin import ModelManifest


def mlx_missing() -> str | None:
    """Why MLX cannot run in this interpreter, or ``None``."""
    why = mlx_platform()
    if why is not None:
        return why
    if importlib.util.find_spec("mlx") is None or importlib.util.find_spec("mlx_lm") is None:
        return "mlx and mlx-lm are not installed in this interpreter (pip install -e plugins/omlx)"
    return None


@pytest.fixture(scope="session")
def mlx_ready() -> None:
    why = mlx_missing()
    if why is not None:
        pytest.skip(why)


@pytest.fixture(autouse=True)
def _no_user_omlx_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The developer's own oMLX settings must not leak into the tests."""
    for name in (ENV_BUDGET, ENV_PYTHON, "WERK_OMLX"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def moe_f32(mlx_ready: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny float32 MoE (4 layers × 8 experts of 384 KiB, top-2)."""
    return generate(tmp_path_factory.mktemp("moe") / "moe-f32", TINY, seed=1)


@pytest.fixture(scope="session")
def moe_q4(mlx_ready: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same shape quantized to 4 bits by mlx-lm's convert (stacked expert layout)."""
    return generate(tmp_path_factory.mktemp("moe") / "moe-q4", TINY, seed=1, bits=4)


def manifest_of(directory: Path, name: str = "moe") -> ModelManifest:
    """The manifest Werk registers for an MLX model directory, pinned to this backend."""
    files = sorted(p for p in directory.iterdir() if p.is_file())
    return ModelManifest.from_paths(name, files, backend="omlx")


@pytest.fixture
def budget_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """``WERK_OMLX_EXPERT_CACHE_MB=2`` (5 of the tiny model's 32 experts) for the test."""
    monkeypatch.setenv(ENV_BUDGET, "2")
    yield 2

"""``werk doctor``'s oMLX checks (werk_omlx/doctor.py; docs/cli.md, "werk doctor"): the platform,
the MLX worker interpreter's mlx and mlx-lm, and an interpreter without them."""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

import pytest
from werk_omlx import doctor
from werk_omlx.interpreter import apple_silicon

from werk_host.plugin import DoctorCheck, HostConfig


def by_name(found: list[DoctorCheck]) -> dict[str, DoctorCheck]:
    return {c.name: c for c in found}


def test_the_platform_and_this_interpreters_mlx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WERK_OMLX_PYTHON", raising=False)
    found = by_name(doctor.checks(HostConfig(home=tmp_path)))
    platform = found["omlx.platform"]
    if apple_silicon():
        assert platform.status == "ok" and "omlx.cli" in found
    elif sys.platform.startswith("linux"):  # a warning about the oMLX CLI, not a failure of the machine
        assert platform.status == "warn" and "needs macOS on Apple silicon" in platform.detail
        assert "omlx.cli" not in found
    mlx = found["omlx.mlx"]
    versions = importlib.metadata.version("mlx"), importlib.metadata.version("mlx-lm")
    assert mlx == DoctorCheck("omlx.mlx", "ok", f"mlx {versions[0]}, mlx-lm {versions[1]} (this interpreter)")


def test_a_worker_interpreter_without_mlx_fails_with_the_install_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bare = tmp_path / "python"  # the same Python without site-packages: no mlx, no mlx-lm
    bare.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S -I "$@"\n')
    bare.chmod(0o755)
    monkeypatch.setenv("WERK_OMLX_PYTHON", str(bare))
    mlx = by_name(doctor.checks(HostConfig(home=tmp_path)))["omlx.mlx"]
    assert mlx.status == "fail" and mlx.detail == "mlx and mlx-lm not installed for WERK_OMLX_PYTHON"
    assert mlx.fix == doctor.INSTALL_FIX


def test_a_worker_interpreter_that_does_not_run_fails(tmp_path: Path) -> None:
    missing = tmp_path / "no-python"
    config = HostConfig(home=tmp_path, backend_options={"omlx": {"python": str(missing)}})
    mlx = by_name(doctor.checks(config))["omlx.mlx"]
    assert mlx.status == "fail" and "could not be run" in mlx.detail and "the omlx.python option" in mlx.detail

"""plugins/_template copied as its README says, under a hyphenated name, before and after the
copier drops the ``COPIERS:`` markers: its own name checks pass (docs/plugin-kit.md)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TEMPLATE = Path(__file__).resolve().parents[1] / "plugins" / "_template"
NAME, PKG, CLASS = "my-echo", "werk_my_echo", "MyEcho"


def copy_as_the_readme_says(target: Path) -> Path:
    """README steps 1 and 2: copy, move the package, replace the four spellings in order."""
    shutil.copytree(TEMPLATE, target, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
    (target / "src" / "werk_template").rename(target / "src" / PKG)
    for path in [target / "pyproject.toml", *(target / "src").rglob("*.py"), *(target / "tests").rglob("*.py")]:
        text = path.read_text(encoding="utf-8")
        for old, new in (("werk-template", f"werk-{NAME}"), ("werk_template", PKG), ("Template", CLASS)):
            text = text.replace(old, new)
        path.write_text(text.replace("template", NAME), encoding="utf-8")
    return target


def run_name_tests(copy: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_names.py"],
        cwd=copy,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("markers", ["kept", "dropped"])
def test_a_hyphenated_copy_passes_its_name_checks(tmp_path: Path, markers: str) -> None:
    copy = copy_as_the_readme_says(tmp_path / f"werk-{NAME}")
    if markers == "dropped":  # a finished copy: every COPIERS: comment (and docstring) line removed
        for path in [*copy.rglob("*.py"), copy / "pyproject.toml"]:
            lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
            kept = [line for line in lines if not line.lstrip().startswith(("# COPIERS:", "COPIERS:"))]
            assert len(kept) < len(lines) or path.name == "test_names.py" or "COPIERS" not in "".join(lines)
            path.write_text("".join(kept), encoding="utf-8")
    result = run_name_tests(copy)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 passed, 1 skipped" in result.stdout, result.stdout


def test_a_copy_renamed_halfway_fails(tmp_path: Path) -> None:
    copy = copy_as_the_readme_says(tmp_path / f"werk-{NAME}")
    plugin = copy / "src" / PKG / "plugin.py"
    plugin.write_text(plugin.read_text(encoding="utf-8") + f"\n# from werk_template import {CLASS}\n")
    result = run_name_tests(copy)
    assert result.returncode != 0 and "still carries the original names" in result.stdout, result.stdout

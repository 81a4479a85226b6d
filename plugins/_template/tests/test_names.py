"""One name throughout: distribution ``werk-NAME``, package ``werk_NAME``, entry point and
backend id ``NAME`` (README.md). A copy renamed halfway fails here before anything runs."""

from __future__ import annotations

import tomllib
from pathlib import Path

import werk_template
from werk_template import adapter, plugin

ROOT = Path(__file__).resolve().parents[1]


def test_the_distribution_package_entry_point_and_backend_share_one_name() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    name = adapter.BACKEND_ID
    package = f"werk_{name}"
    assert project["project"]["name"] == f"werk-{name}"
    assert project["project"]["entry-points"]["werk"] == {name: f"{package}.plugin"}
    assert list(project["tool"]["setuptools"]["package-data"]) == [package]
    assert werk_template.__name__ == package and Path(werk_template.__file__).parent == ROOT / "src" / package
    assert name == plugin.PLUGIN_NAME


def test_every_file_a_copier_edits_marks_its_places() -> None:
    marked = {p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*") if p.is_file() and "COPIERS:" in _text(p)}
    assert {
        "pyproject.toml",
        "src/werk_template/__init__.py",
        "src/werk_template/adapter.py",
        "src/werk_template/plugin.py",
        "tests/test_conformance.py",
    } <= marked


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return ""

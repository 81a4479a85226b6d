"""Fixtures: the nodes loaded the way ComfyUI loads them (``comfy.load_custom_node`` on this
package's folder), a real ``werk serve`` on llama.cpp with SmolLM2-135M-Instruct and a key, and
one with the media workers (the tiny diffusers pipeline and the tiny Qwen3-TTS model, each in
its engine interpreter).

The llama.cpp tests skip, naming the script, without a ``llama-server`` build; the media tests
without ``WERK_DIFFUSERS_PYTHON``/``WERK_QWEN_TTS_PYTHON`` (scripts/setup-engine-venv.sh)."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from comfyui_host import load_custom_node

from werk_host.plugin import ModelManifest
from werk_host.testing.host import ModelRegistry
from werk_host.testing.hosts import ServeProcess, serve_process

PACKAGE = Path(__file__).resolve().parents[1]
KEY_ENV = "WERK_COMFYUI_TEST_KEY"


@pytest.fixture(scope="session")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, type]:
    """``custom_nodes/werk-comfyui`` (this folder, linked) imported as ComfyUI does."""
    custom_nodes = tmp_path_factory.mktemp("custom_nodes")
    (custom_nodes / "werk-comfyui").symlink_to(PACKAGE, target_is_directory=True)
    return load_custom_node(custom_nodes / "werk-comfyui")


@pytest.fixture(scope="session")
def key() -> str:
    return f"sk-comfyui-{secrets.token_hex(12)}"


@pytest.fixture
def key_env(monkeypatch: pytest.MonkeyPatch, key: str) -> str:
    """The key in the environment variable the connection nodes name."""
    monkeypatch.setenv(KEY_ENV, key)
    return KEY_ENV


@pytest.fixture(scope="session")
def llama_server() -> Path:
    from werk_llamacpp.binary import LlamaServerNotFound, find_llama_server

    try:
        return find_llama_server(use_path=False)
    except LlamaServerNotFound:
        pytest.skip("no llama-server binary: run scripts/build-llama-server.sh or set WERK_LLAMA_SERVER")


@pytest.fixture(scope="module")
def text_server(
    tmp_path_factory: pytest.TempPathFactory, llama_server: Path, smollm2_gguf: Path, key: str
) -> Iterator[ServeProcess]:
    home = tmp_path_factory.mktemp("comfyui-text") / "home"
    home.mkdir()
    ModelRegistry(home).add(ModelManifest.from_paths("smollm2", [smollm2_gguf], backend="llama.cpp"))
    environ = {"WERK_LLAMA_SERVER": str(llama_server), "WERK_LLAMA_ARGS": "--temp 0"}
    with serve_process(home, "--model", "smollm2", keys=(key,), env=environ) as served:
        yield served


def _engine(variable: str) -> str:
    python = os.environ.get(variable)
    if not python:
        pytest.skip(f"{variable} is unset: run scripts/setup-engine-venv.sh (scripts/test.sh does)")
    return python


@pytest.fixture(scope="module")
def media_server(tmp_path_factory: pytest.TempPathFactory, key: str) -> Iterator[ServeProcess]:
    from werk_diffusers.testing import tiny_pipeline
    from werk_qwen_tts.testing.models import tiny_model

    diffusers, qwen = _engine("WERK_DIFFUSERS_PYTHON"), _engine("WERK_QWEN_TTS_PYTHON")
    home = tmp_path_factory.mktemp("comfyui-media") / "home"
    home.mkdir()
    environ = {"WERK_DIFFUSERS_PYTHON": diffusers, "WERK_QWEN_TTS_PYTHON": qwen}
    for name, folder in (("tiny-sd", tiny_pipeline(diffusers)), ("tiny-tts", tiny_model(qwen))):
        added = subprocess.run(
            [sys.executable, "-m", "werk_host", "models", "add", name, str(folder)],
            capture_output=True,
            text=True,
            env={**os.environ, "WERK_HOME": str(home), **environ},
            timeout=120,
            check=False,
        )
        assert added.returncode == 0, added.stderr
    args = ("--model", "tiny-sd", "--model", "tiny-tts")
    args += ("--backend-option", "diffusers.threads=1", "--backend-option", "qwen-tts.threads=1")
    with serve_process(home, *args, keys=(key,), env=environ) as served:
        yield served

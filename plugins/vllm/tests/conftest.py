"""Fixtures for werk-vllm tests.

Tests marked ``vllm`` need a real vLLM: the executable named by ``WERK_VLLM`` (for instance
``~/.cache/werk/vllm/<version>/venv/bin/vllm``, which ``scripts/setup-vllm.sh`` installs).
Without it, or when it does not run, they are skipped with that reason. Every other test runs
without vLLM (a stand-in executable, ``fake_vllm.py``, plays its part).

``tiny_hf_model`` is a tiny random Llama in Hugging Face format, written once per session by
``werk_vllm/testing/testmodel.py`` run with the vLLM virtualenv's own interpreter (which has torch and
transformers); the plugin itself needs neither. ``tiny_hf_classifier`` is the same model as a
one-label sequence classifier (a reranker).
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import werk_vllm
from vllm_helpers import FAKE_VLLM
from werk_vllm.executable import InspectionError, inspect_vllm
from werk_vllm.launch import ENV_ARGS


@pytest.fixture(scope="session", autouse=True)
def _no_user_vllm_args() -> Iterator[None]:
    """The developer's own WERK_VLLM_ARGS must not leak into the tests."""
    saved = os.environ.pop(ENV_ARGS, None)
    yield
    if saved is not None:
        os.environ[ENV_ARGS] = saved


@pytest.fixture(scope="session")
def vllm_executable() -> Path:
    """The vLLM executable of ``WERK_VLLM`` (skips the test when unset or not runnable)."""
    raw = os.environ.get("WERK_VLLM")
    if not raw:
        reason = (
            "WERK_VLLM is not set: tests marked vllm need a vLLM executable "
            "(run scripts/setup-vllm.sh and export WERK_VLLM=<its venv>/bin/vllm)"
        )
        print(f"\n[werk-vllm] skipping: {reason}", file=sys.stderr)
        pytest.skip(reason)
    path = Path(raw).expanduser()
    try:
        inspect_vllm(path)  # runs `vllm serve --help=all`; cached for the session
    except InspectionError as err:
        reason = f"WERK_VLLM={raw} is not a runnable vLLM: {err}"
        print(f"\n[werk-vllm] skipping: {reason}", file=sys.stderr)
        pytest.skip(reason)
    return path.absolute()


@pytest.fixture(scope="session")
def tiny_hf_model(vllm_executable: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama directory (tokenizer, ChatML template, float32 safetensors)."""
    out = tmp_path_factory.mktemp("hf") / "tiny-llama"
    python = vllm_executable.parent / "python"
    script = Path(werk_vllm.__file__).parent / "testing" / "testmodel.py"
    subprocess.run([str(python), str(script), str(out), "--seed", "7"], check=True, capture_output=True, timeout=600)
    assert (out / "config.json").is_file()
    return out


@pytest.fixture(scope="session")
def tiny_hf_classifier(vllm_executable: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same tiny Llama as a one-label ``LlamaForSequenceClassification`` (a cross-encoder)."""
    out = tmp_path_factory.mktemp("hf") / "tiny-llama-classifier"
    python = vllm_executable.parent / "python"
    script = Path(werk_vllm.__file__).parent / "testing" / "testmodel.py"
    command = [str(python), str(script), str(out), "--seed", "7", "--classifier"]
    subprocess.run(command, check=True, capture_output=True, timeout=600)
    assert (out / "config.json").is_file()
    return out


@pytest.fixture
def fake_vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in ``vllm`` executable (``fake_vllm.py``); its records land in ``tmp_path/records``."""
    records = tmp_path / "records"
    records.mkdir()
    monkeypatch.setenv("FAKE_VLLM_RECORD", str(records))
    exe = tmp_path / "bin" / "vllm"
    exe.parent.mkdir()
    exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE_VLLM}" "$@"\n')
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


@pytest.fixture
def fake_model(tmp_path: Path) -> Path:
    """A directory that looks like a Hugging Face model to Werk (the fake server never reads it)."""
    directory = tmp_path / "fake-model"
    directory.mkdir()
    (directory / "config.json").write_text('{"model_type": "llama"}')
    (directory / "model.safetensors").write_bytes(b"\0" * 64)
    return directory

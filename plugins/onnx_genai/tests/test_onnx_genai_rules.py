"""Rules that need no engine: options, the model LRU's bound, which manifests the backend takes,
and that nothing the plugin loads at run time imports its testing package."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from werk_onnx_genai.adapter import accepts, genai_context
from werk_onnx_genai.settings import CACHE_SIZE_ENV, PYTHON_ENV, cache_size, parse_options

from werk_host.plugin import ModelManifest
from werk_host.testing.engines import assert_model_cache_size


def test_options_are_checked_by_name_without_echoing_values() -> None:
    assert parse_options({}, env={PYTHON_ENV: "/x/python"}).python == "/x/python"
    assert parse_options({"python": "/y/python", "startup_timeout": 60}, env={}).startup_timeout == 60
    for bad, named in [({"pyhton": "/x"}, "pyhton"), ({"startup_timeout": 0}, "startup_timeout")]:
        with pytest.raises(ValueError, match=named):
            parse_options(bad, env={})


def test_the_model_cache_size_defaults_to_one_and_must_be_positive() -> None:
    assert_model_cache_size(cache_size, CACHE_SIZE_ENV)


def _manifest(tmp_path: Path, files: dict[str, bytes], backend: str | None = None) -> ModelManifest:
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    return ModelManifest.from_paths("m", [tmp_path / n for n in files], backend=backend)


def test_accepts_pinned_manifests_and_unpinned_genai_directories(tmp_path: Path) -> None:
    assert accepts(_manifest(tmp_path, {"genai_config.json": b"{}", "model.onnx": b"\0"}))
    assert not accepts(_manifest(tmp_path, {"config.json": b"{}", "model.safetensors": b"\0" * 16}))
    assert not accepts(_manifest(tmp_path, {"genai_config.json": b"{}"}, backend="transformers"))
    assert accepts(_manifest(tmp_path, {"model.gguf": b"GGUF"}, backend="onnx-genai"))
    assert not accepts(None)


def test_the_context_comes_from_genai_config(tmp_path: Path) -> None:
    (tmp_path / "genai_config.json").write_text('{"model": {"context_length": 2048}}')
    assert genai_context(tmp_path) == 2048
    (tmp_path / "genai_config.json").write_text('{"model": {"context_length": "long"}}')
    assert genai_context(tmp_path) is None


def test_the_runtime_never_imports_the_testing_package() -> None:
    probe = (
        "import sys, werk_onnx_genai.plugin; print(any(m.startswith('werk_onnx_genai.testing') for m in sys.modules))"
    )
    assert (
        subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
        == "False"
    )

"""Rules that need no engine: options, the model LRU's bound, which manifests the backend takes,
and that nothing the plugin loads at run time imports its testing package."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from werk_transformers.adapter import accepts
from werk_transformers.settings import CACHE_SIZE_ENV, PYTHON_ENV, cache_size, parse_options

from werk_host.plugin import ModelManifest
from werk_host.testing.engines import assert_model_cache_size


def test_options_are_checked_by_name_without_echoing_values() -> None:
    assert parse_options({"device": "cuda:1", "dtype": "bfloat16", "threads": 2}, env={}).device == "cuda:1"
    assert parse_options({}, env={PYTHON_ENV: "/x/python"}).python == "/x/python"
    for bad, named in [({"devcie": "cpu"}, "devcie"), ({"dtype": "int3"}, "dtype"), ({"threads": -1}, "threads")]:
        with pytest.raises(ValueError, match=named) as caught:
            parse_options(bad, env={})
        assert "int3" not in str(caught.value)


def test_the_model_cache_size_defaults_to_one_and_must_be_positive() -> None:
    assert_model_cache_size(cache_size, CACHE_SIZE_ENV)


def _manifest(tmp_path: Path, files: dict[str, bytes], backend: str | None = None) -> ModelManifest:
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    return ModelManifest.from_paths("m", [tmp_path / n for n in files], backend=backend)


def test_accepts_pinned_manifests_and_unpinned_checkpoint_directories(tmp_path: Path) -> None:
    header = b'{"__metadata__": {"format": "mlx"}}'
    mlx = len(header).to_bytes(8, "little") + header
    assert accepts(_manifest(tmp_path, {"config.json": b"{}", "model.safetensors": b"\0" * 16}))
    assert not accepts(_manifest(tmp_path, {"config.json": b"{}", "model.safetensors": mlx}))
    assert not accepts(_manifest(tmp_path, {"config.json": b"{}", "model.safetensors": b"\0" * 16}, backend="vllm"))
    assert accepts(_manifest(tmp_path, {"model.gguf": b"GGUF"}, backend="transformers"))
    assert not accepts(_manifest(tmp_path, {"model.gguf": b"GGUF"}))
    assert not accepts(None)


def test_the_runtime_never_imports_the_testing_package() -> None:
    probe = "import sys, werk_transformers.plugin; print(any(m.startswith('werk_transformers.testing') for m in sys.modules))"
    assert (
        subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
        == "False"
    )

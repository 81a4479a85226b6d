"""Rules that need no engine: options, the model LRU's bound, which manifests the backend takes,
which checkpoints are embedding instances, and that nothing the plugin loads at run time imports
its testing package."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from werk_transformers.adapter import REPORTED, accepts
from werk_transformers.embeddings import instance_pooling
from werk_transformers.settings import CACHE_SIZE_ENV, PYTHON_ENV, cache_size, parse_options

from werk_host.plugin import CapabilityId, ModelManifest
from werk_host.testing.engines import assert_model_cache_size


def test_options_are_checked_by_name_without_echoing_values() -> None:
    assert parse_options({"device": "cuda:1", "dtype": "bfloat16", "threads": 2}, env={}).device == "cuda:1"
    assert parse_options({}, env={PYTHON_ENV: "/x/python"}).python == "/x/python"
    for bad, named in [({"devcie": "cpu"}, "devcie"), ({"dtype": "int3"}, "dtype"), ({"threads": -1}, "threads")]:
        with pytest.raises(ValueError, match=named) as caught:
            parse_options(bad, env={})
        assert "int3" not in str(caught.value)
    assert parse_options({"pooling": "cls"}, env={}).pooling == "cls"
    assert parse_options({}, env={}).pooling is None
    for bad in ("max", 1, None, ["mean"]):
        with pytest.raises(ValueError, match="pooling") as caught:
            parse_options({"pooling": bad}, env={})
        assert "max" not in str(caught.value)


@pytest.mark.parametrize(
    ("config", "pooling"),
    [
        ({"architectures": ["BertModel"], "model_type": "bert"}, "mean"),
        ({"architectures": ["XLMRobertaModel"], "model_type": "xlm-roberta"}, "mean"),
        ({"architectures": ["BertForMaskedLM"], "model_type": "bert"}, "mean"),
        ({"architectures": ["SomeNewForMaskedLM"], "model_type": "somenew"}, "mean"),
        ({"architectures": ["BertLMHeadModel"], "model_type": "bert", "is_decoder": True}, None),
        ({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}, None),
        ({"architectures": ["MistralModel"], "model_type": "mistral"}, None),  # last-token models: say so
        ({"architectures": ["BertModel", "BertForCausalLM"], "model_type": "bert"}, None),
        ({"model_type": "bert"}, None),
    ],
)
def test_an_encoder_checkpoint_is_a_mean_pooling_embedding_instance(
    tmp_path: Path, config: dict[str, object], pooling: str | None
) -> None:
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert instance_pooling(parse_options({}, env={}), tmp_path) == pooling
    assert instance_pooling(parse_options({"pooling": "cls"}, env={}), tmp_path) == "cls"


def test_the_plugin_declares_embeddings_and_rerank() -> None:
    assert {CapabilityId.EMBEDDINGS, CapabilityId.RERANK} <= set(REPORTED)


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

"""The real command line: ``werk serve`` answers ``/v1/chat/completions`` through the
transformers worker, and the worker dies with ``werk serve`` even when it is SIGKILLed; an
unpinned checkpoint directory is refused when vLLM could serve it too, naming both."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from werk_transformers.adapter import WORKER

from werk_host.testing.engines import serve_dies_with_werk, werk_command


@pytest.mark.engine
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the worker through /proc")
def test_werk_serve_answers_v1_chat_and_its_worker_dies_with_it(tmp_path: Path, engine: str, checkpoint: Path) -> None:
    serve_dies_with_werk(
        tmp_path / "home",
        checkpoint,
        worker=WORKER,
        env={"WERK_TRANSFORMERS_PYTHON": engine},
        add=("--backend", "transformers"),
        serve=("--backend-option", "transformers.threads=1"),
    )


@pytest.mark.skipif(
    importlib.util.find_spec("werk_vllm") is None, reason="needs werk-vllm installed beside werk-transformers"
)
def test_an_unpinned_checkpoint_directory_names_both_backends(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    (model / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    home = tmp_path / "home"
    assert werk_command(home, "models", "add", "tiny", str(model)).returncode == 0
    refused = werk_command(home, "serve", "--port", "0", "--model", "tiny", env={"WERK_DISABLE_PLUGINS": ""})
    assert refused.returncode != 0
    assert "more than one installed backend" in refused.stderr
    assert "transformers" in refused.stderr and "vllm" in refused.stderr
    # A pinned manifest wins: the test above serves this kind of directory with --backend transformers.

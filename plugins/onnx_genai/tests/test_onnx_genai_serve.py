"""The real command line: ``werk serve`` answers ``/v1/chat/completions`` through the ONNX GenAI
worker for an unpinned GenAI model directory, and the worker dies with ``werk serve`` even when
it is SIGKILLed."""

from __future__ import annotations

from pathlib import Path

import pytest
from werk_onnx_genai.adapter import WORKER

from werk_host.testing.engines import serve_dies_with_werk


@pytest.mark.engine
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the worker through /proc")
def test_werk_serve_answers_v1_chat_and_its_worker_dies_with_it(tmp_path: Path, engine: str, genai_model: Path) -> None:
    # Unpinned: a GenAI model directory is this backend's alone, whatever else is installed.
    serve_dies_with_werk(tmp_path / "home", genai_model, worker=WORKER, env={"WERK_ONNX_GENAI_PYTHON": engine})

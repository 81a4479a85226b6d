"""Helpers shared by the werk-vllm tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from werk_host.plugin import ModelManifest

TESTS = Path(__file__).parent
FAKE_VLLM = TESTS / "fake_vllm.py"


def model_manifest(directory: Path, name: str = "tiny", **params: Any) -> ModelManifest:
    """The manifest of a Hugging Face model directory, as Werk registers it for vLLM."""
    files = sorted(p for p in directory.iterdir() if p.is_file())
    return ModelManifest.from_paths(name, files, backend="vllm", params=dict(params))


def records(directory: Path, what: str) -> list[dict[str, Any]]:
    """The JSON lines ``fake_vllm.py`` appended to ``directory/<what>.jsonl``."""
    path = directory / f"{what}.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

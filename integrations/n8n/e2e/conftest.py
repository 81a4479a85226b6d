"""Fixtures of the n8n end-to-end test: the real llama-server (as in plugins/llamacpp/tests).

``smollm2_gguf`` comes from werk_host's pytest plugin (werk_host/testing/pytest_plugin.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from werk_llamacpp.binary import LlamaServerNotFound, build_cache_root, find_llama_server


@pytest.fixture(autouse=True)
def _no_user_llama_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The developer's own WERK_LLAMA_ARGS must not leak into the test."""
    monkeypatch.delenv("WERK_LLAMA_ARGS", raising=False)


@pytest.fixture(scope="session")
def llama_server_path() -> Path:
    try:
        return find_llama_server(use_path=False)
    except LlamaServerNotFound:
        pytest.skip(
            "no llama-server binary: set WERK_LLAMA_SERVER or run scripts/build-llama-server.sh "
            f"(cache {build_cache_root()})"
        )

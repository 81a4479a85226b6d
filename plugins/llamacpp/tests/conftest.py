"""Fixtures for werk-llamacpp tests.

Tests marked ``llamaserver`` need a real llama-server. It is taken from
``WERK_LLAMA_SERVER`` or the cache of ``scripts/build-llama-server.sh``
(``${XDG_CACHE_HOME:-~/.cache}/werk/llama-server/<version>/llama-server``);
without one those tests are skipped with that reason.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from werk_llamacpp.binary import LlamaServerNotFound, build_cache_root, find_llama_server
from werk_llamacpp.process import LlamaServerProcess
from werk_llamacpp.testing.testmodel import generate_model


@pytest.fixture(autouse=True)
def _no_user_llama_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The developer's own WERK_LLAMA_ARGS must not leak into tests."""
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


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default generated test model (64-dim, 2 layers, real SPM byte-fallback vocab, ChatML)."""
    return generate_model(tmp_path_factory.mktemp("model") / "tiny-llama.gguf")


@pytest.fixture(scope="module")
def server(llama_server_path: Path, tiny_model: Path) -> Iterator[LlamaServerProcess]:
    """A running llama-server (2 slots, 4096 context) shared by one test module."""
    proc = LlamaServerProcess(tiny_model, binary=llama_server_path, parallel=2, ctx=4096, env_args="")
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()

"""The default per-request context of a llama.cpp instance (issue 30 item 6; docs/deployments.md,
"llama.cpp options"): the model's trained context from the GGUF header, where memory allows.

The header reader is checked against the ``gguf`` package's own writer (generated models) and
reader (the real SmolLM2 file), and the default is checked end to end on a real llama-server:
the child's ``/slots`` report the context per slot, and the host's chat limits say the same.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest
from werk_llamacpp import gguf_meta
from werk_llamacpp.adapter import LlamaCppAdapter
from werk_llamacpp.gguf_meta import (
    KV_MEMORY_SHARE,
    MIN_SLOT_CONTEXT,
    GgufError,
    default_context,
    kv_bytes_per_token,
    read_metadata,
)
from werk_llamacpp.testing.testmodel import generate_model

from werk_host.plugin import HostConfig, ModelManifest

GIB = 1 << 30


@pytest.fixture(scope="module")
def long_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A generated model trained (by its header) for 16384 tokens, 2 kv heads of 16 over 4 layers."""
    return generate_model(
        tmp_path_factory.mktemp("ctx") / "long.gguf", dim=64, layers=4, heads=4, kv_heads=2, ctx=16384
    )


def test_header_reader_agrees_with_the_gguf_package(long_model: Path, smollm2_gguf: Path) -> None:
    for path in (long_model, smollm2_gguf):
        mine = read_metadata(path)
        theirs = gguf.GGUFReader(str(path))
        for name, field in theirs.fields.items():
            if name.startswith("GGUF.") or name not in mine:
                continue
            kind = field.types[0] if field.types else None
            if kind == gguf.GGUFValueType.ARRAY:
                assert mine[name] is None
            elif kind == gguf.GGUFValueType.STRING:
                assert mine[name] == bytes(field.parts[field.data[0]]).decode("utf-8")
            else:
                assert mine[name] == pytest.approx(field.parts[field.data[0]][0])
        assert len(mine) == len([n for n in theirs.fields if not n.startswith("GGUF.")])


def test_kv_size_from_the_header(long_model: Path, smollm2_gguf: Path) -> None:
    # 2 bytes x 4 layers x 2 kv heads x (16 + 16)
    assert kv_bytes_per_token(read_metadata(long_model)) == 2 * 4 * 2 * 32
    smol = read_metadata(smollm2_gguf)
    assert smol["llama.context_length"] == 8192
    assert kv_bytes_per_token(smol) == 2 * 30 * 3 * 128  # 30 layers, 3 kv heads, head size 64


def test_default_context_is_the_trained_one_where_memory_allows(long_model: Path, tmp_path: Path) -> None:
    assert default_context(long_model, 2, 64 * GIB) == 16384
    per_token = 2 * 4 * 2 * 32
    tight = int(10000 * per_token * 2 / KV_MEMORY_SHARE)  # room for 10000 tokens on each of 2 slots
    assert default_context(long_model, 2, tight) == 10000
    assert default_context(long_model, 2, 0) == MIN_SLOT_CONTEXT  # never below the earlier default
    short = generate_model(tmp_path / "short.gguf", ctx=2048)
    assert default_context(short, 2, 64 * GIB) == MIN_SLOT_CONTEXT
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 16)
    with pytest.raises(GgufError):
        read_metadata(garbage)
    assert default_context(garbage, 2, 64 * GIB) == MIN_SLOT_CONTEXT


@pytest.fixture
def header_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The files whose GGUF header was walked from now on (a user cache of the test's own)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    reads: list[str] = []
    real = gguf_meta._read_header

    def counting(path: str) -> dict[str, gguf_meta.Value]:
        reads.append(path)
        return real(path)

    monkeypatch.setattr(gguf_meta, "_read_header", counting)
    return reads


def test_a_header_is_read_once_per_file_status(long_model: Path, tmp_path: Path, header_reads: list[str]) -> None:
    """The memory estimate, the default context and the partial-cache check each ask for the
    header as an instance starts: an unchanged file is read once, a changed one again."""
    copy = tmp_path / "copy.gguf"
    copy.write_bytes(long_model.read_bytes())
    first = read_metadata(copy)
    first["llama.context_length"] = 1  # a caller's copy: the reading it came from is unchanged
    assert read_metadata(copy)["llama.context_length"] == 16384
    assert default_context(copy, 2, 64 * GIB) == 16384
    assert len(header_reads) == 1
    generate_model(copy, dim=64, layers=4, heads=4, kv_heads=2, ctx=8192)
    assert read_metadata(copy)["llama.context_length"] == 8192
    assert len(header_reads) == 2


def test_a_later_process_is_given_the_header_remembered_by_the_file_status(
    long_model: Path, tmp_path: Path, header_reads: list[str]
) -> None:
    """A later start (nothing in memory) of an unchanged file does not walk its header again:
    the reading is remembered under the user cache by the file's status; a changed file is read."""
    copy = tmp_path / "copy.gguf"
    copy.write_bytes(long_model.read_bytes())
    first = read_metadata(copy)
    gguf_meta._READ.clear()  # as in a new process
    assert read_metadata(copy) == first and len(header_reads) == 1
    generate_model(copy, dim=64, layers=4, heads=4, kv_heads=2, ctx=8192)
    gguf_meta._READ.clear()
    assert read_metadata(copy)["llama.context_length"] == 8192 and len(header_reads) == 2


@pytest.mark.llamaserver
def test_an_instance_without_ctx_serves_the_trained_context(
    tmp_path: Path, llama_server_path: Path, smollm2_gguf: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    manifest = ModelManifest.from_paths("smollm2", [smollm2_gguf], backend="llama.cpp")
    adapter = LlamaCppAdapter(HostConfig(home=home), manifest, {"llama_server": str(llama_server_path)})
    try:
        assert adapter.ctx == 2 * 8192
        proc = adapter.process()
        assert [s.n_ctx for s in proc.new_client(timeout=10).slots()] == [8192, 8192]
        assert adapter.chat_limits("smollm2").context_tokens == 8192
        explicit = LlamaCppAdapter(HostConfig(home=home), manifest, {"ctx": 4096, "parallel": 2})
        assert explicit.ctx == 4096  # an explicit ctx is kept as given
    finally:
        adapter.close()

"""Model-file digests remembered by file status (werk_host/digests.py): a remembered digest is
used only while the file's status is unchanged, and the cache never makes a digest wrong."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from werk_host import digests
from werk_host.models import ModelManifest


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return digests.cache_file()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_digest_is_remembered_and_reused_while_the_file_is_unchanged(tmp_path: Path, cache: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"weights" * 1000)
    assert digests.remembered_sha256(model) == _sha(b"weights" * 1000)
    entry = json.loads(cache.read_text())[str(model)]
    assert entry["value"] == _sha(b"weights" * 1000)
    # the remembered value is what a second call answers (planted here to prove no rehash)
    entry["value"] = "0" * 64
    cache.write_text(json.dumps({str(model): entry}))
    assert digests.remembered_sha256(model) == "0" * 64


def test_a_rewritten_file_is_hashed_again_even_with_the_same_size_and_mtime(tmp_path: Path, cache: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"a" * 4096)
    first = digests.remembered_sha256(model)
    stat = model.stat()
    model.write_bytes(b"b" * 4096)
    os.utime(model, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same size, same mtime: ctime moved
    second = digests.remembered_sha256(model)
    assert (first, second) == (_sha(b"a" * 4096), _sha(b"b" * 4096))


def test_a_replaced_file_is_hashed_again(tmp_path: Path, cache: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"old")
    digests.remembered_sha256(model)
    other = tmp_path / "new.gguf"
    other.write_bytes(b"new")
    other.replace(model)  # another inode under the same path
    assert digests.remembered_sha256(model) == _sha(b"new")


@pytest.mark.parametrize("content", ["not json", "[1, 2]", '{"x": 1}', ""])
def test_a_malformed_cache_is_a_miss_and_is_rewritten(tmp_path: Path, cache: Path, content: str) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"weights")
    cache.parent.mkdir(parents=True)
    cache.write_text(content)
    assert digests.remembered_sha256(model) == _sha(b"weights")
    assert json.loads(cache.read_text())[str(model)]["value"] == _sha(b"weights")


def test_an_unwritable_cache_leaves_the_digest_computed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache directory would be")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    model = tmp_path / "m.gguf"
    model.write_bytes(b"weights")
    assert digests.remembered_sha256(model) == _sha(b"weights")


def test_the_cache_keeps_a_bounded_number_of_files(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(digests, "MAX_ENTRIES", 3)
    files = []
    for i in range(5):
        files.append(tmp_path / f"m{i}.gguf")
        files[-1].write_bytes(bytes([i]))
        digests.remembered_sha256(files[-1])
    assert list(json.loads(cache.read_text())) == [str(f) for f in files[2:]]


def test_a_manifest_from_paths_carries_the_true_digest(tmp_path: Path, cache: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"weights")
    first = ModelManifest.from_paths("m", [model])
    model.write_bytes(b"other weights")
    second = ModelManifest.from_paths("m", [model])
    assert first.files[0].sha256 == _sha(b"weights")
    assert second.files[0].sha256 == _sha(b"other weights")
    assert first.identity != second.identity

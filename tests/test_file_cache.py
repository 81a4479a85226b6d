"""The model-lifetime guard (docs/operations.md, "Model file cache"; werk_host/filecache.py).

On real files and the kernel's own page cache (``mincore`` reads it back): a release drops an
unshared, unchanged file's clean pages; another reader's lease, a file changed or replaced
since it was leased, a lease never granted and the ``off`` switch each keep them, with the
reason. The switch's precedence and refusals (profile, ``werk serve``, the environment), and an
instance's inventory over the reference backend: leased while it runs, the release recorded
after it stops.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest

from werk_host.deployments.profile import ProfileError, parse_profile
from werk_host.filecache import ModelFiles, on_wsl, release_enabled, release_mode
from werk_host.pages import PAGE, FileMapping, resident_bytes
from werk_host.testing.hosts import backend_host, running

SIZE = 8 << 20


@pytest.fixture
def weights(tmp_path: Path) -> Path:
    """A file written through to disk (clean pages) and read back into the page cache."""
    path = tmp_path / "weights.bin"
    with open(path, "wb") as f:
        f.write(os.urandom(SIZE))
        f.flush()
        os.fsync(f.fileno())
    path.read_bytes()
    assert resident_bytes(path) >= 0.9 * SIZE
    return path


def test_release_drops_an_unshared_files_pages(weights: Path) -> None:
    files = ModelFiles.lease([weights, weights])  # a path named twice is leased once
    assert files.leased == 1
    report = files.release(advise=True)
    assert [f.as_dict() for f in report.files] == [
        {"file": "weights.bin", "bytes": SIZE, "released": True, "why": None}
    ]
    assert resident_bytes(weights) <= 0.05 * SIZE
    assert files.release(advise=True).files == ()  # once


def test_another_readers_lease_keeps_the_pages_until_the_last_one(weights: Path) -> None:
    first, second = ModelFiles.lease([weights]), ModelFiles.lease([weights])
    report = first.release(advise=True)
    assert report.skipped[0].skipped == "shared" and "another Werk reader" in report.summary()
    assert resident_bytes(weights) >= 0.9 * SIZE
    assert second.release(advise=True).released
    assert resident_bytes(weights) <= 0.05 * SIZE


def test_off_keeps_the_pages_and_drops_the_lease(weights: Path) -> None:
    files = ModelFiles.lease([weights])
    report = files.release(advise=False)
    assert report.summary() == "file cache kept (release is off)"
    assert resident_bytes(weights) >= 0.9 * SIZE
    fd = os.open(weights, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # no lease is left behind
    finally:
        os.close(fd)


def test_a_file_changed_or_replaced_since_its_lease_is_kept(weights: Path, tmp_path: Path) -> None:
    files = ModelFiles.lease([weights])
    with open(weights, "r+b") as f:
        f.write(b"x")
        f.flush()
        os.fsync(f.fileno())
    assert files.release(advise=True).files[0].skipped == "changed"
    other = tmp_path / "other.bin"
    other.write_bytes(b"y" * PAGE)
    files = ModelFiles.lease([other])
    other.unlink()
    other.write_bytes(b"z" * PAGE)  # the same name, another file
    assert files.release(advise=True).files[0].skipped == "changed"


def test_a_missing_file_or_a_lease_not_granted_is_no_error(weights: Path, tmp_path: Path) -> None:
    fd = os.open(weights, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a release in progress elsewhere
    try:
        files = ModelFiles.lease([weights, tmp_path / "absent.gguf"], timeout_s=0.05)
        assert files.leased == 0
    finally:
        os.close(fd)
    report = files.release(advise=True)
    assert [(f.name, f.skipped) for f in report.files] == [("weights.bin", "unleased"), ("absent.gguf", "unleased")]
    assert resident_bytes(weights) >= 0.9 * SIZE


def test_a_mapping_reads_residency_and_populates(weights: Path) -> None:
    os.posix_fadvise(os.open(weights, os.O_RDONLY), 0, 0, os.POSIX_FADV_DONTNEED)
    fd = os.open(weights, os.O_RDONLY)
    try:
        with FileMapping(fd, 0, SIZE) as mapping:
            assert mapping.resident() <= 0.05 * SIZE
            mapping.populate(PAGE, 4 * PAGE)
            assert mapping.resident(PAGE, 4 * PAGE) == 4 * PAGE
        with pytest.raises(ValueError):
            FileMapping(fd, 1, PAGE)
    finally:
        os.close(fd)


def test_the_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WERK_MODEL_CACHE_RELEASE", raising=False)
    monkeypatch.delenv("WSL_DISTRO_NAME", raising=False)
    monkeypatch.delenv("WSL_INTEROP", raising=False)
    assert release_mode(None, None) == "auto"
    monkeypatch.setenv("WERK_MODEL_CACHE_RELEASE", "off")
    assert (
        release_mode(None, None) == "off" and release_mode(None, "on") == "on" and release_mode("auto", "on") == "auto"
    )
    monkeypatch.setenv("WERK_MODEL_CACHE_RELEASE", "sometimes")
    with pytest.raises(ValueError, match="one of auto, on, off"):
        release_mode(None, None)
    assert release_enabled("on") and not release_enabled("off")
    wsl = "microsoft" in Path("/proc/sys/kernel/osrelease").read_text().lower()
    assert release_enabled("auto") is wsl is on_wsl()
    monkeypatch.setenv("WSL_DISTRO_NAME", "Ubuntu")
    assert on_wsl() and release_enabled("auto")


def test_a_profile_and_werk_serve_refuse_an_unknown_switch(tmp_path: Path) -> None:
    text = '[[instance]]\nid = "a"\nmodel = "tiny"\nmodel_cache_release = "%s"\n'

    def known(name: str) -> bool:
        return name == "tiny"

    assert parse_profile(text % "on", source="p.toml", known_model=known).instances[0].model_cache_release == "on"
    with pytest.raises(ProfileError, match='instance\\[0\\].model_cache_release: "always" is not one of auto, on, off'):
        parse_profile(text % "always", source="p.toml", known_model=known)
    env = {**os.environ, "WERK_HOME": str(tmp_path), "WERK_MODEL_CACHE_RELEASE": "always"}
    run = [sys.executable, "-m", "werk_host", "serve", "--port", "0"]
    done = subprocess.run(run, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "WERK_MODEL_CACHE_RELEASE" in done.stderr, done.stderr
    done = subprocess.run(
        [*run, "--model-cache-release", "always"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and "invalid choice" in done.stderr, done.stderr


def test_an_instance_leases_its_files_and_records_the_release(tmp_path: Path) -> None:
    host, _plugin = backend_host(tmp_path / "home", model_cache_release="on")
    with running(host):
        deployments = host.fleet.deployments
        assert deployments is not None
        instance = next(iter(deployments.instances.values()))
        instance.use()
        ready = instance.file_cache()
        assert ready is not None and ready.mode == "on" and ready.release and ready.leased_files == 1
        assert instance.stop("test")
        after = instance.file_cache()
        assert after is not None and after.leased_files == 0 and after.last_release is not None
        assert [f.released for f in after.last_release] == [True]
        released = f"file cache released for 1 file(s), {after.last_release[0].bytes} bytes"
        assert any(line.endswith(released) for line in instance.events())
        assert instance.view().state.value == "cold"


def test_werk_deployments_prints_the_last_release() -> None:
    from werk_host.cli.deployments import render_table
    from werk_host.protocol import Deployments
    from werk_host.protocol.deployments import FileCacheFile, InstanceFileCache, InstanceInventory

    def inventory(cache: InstanceFileCache | None) -> InstanceInventory:
        return InstanceInventory(
            id="m", backend="llama.cpp", model="m", aliases=[], default=True, state="cold", pid=None,
            endpoint="local", started_unix_ms=None, last_used_unix_ms=None, in_flight=0,
            keep_alive_seconds=None, error=None, file_cache=cache,
        )  # fmt: skip

    files = [
        FileCacheFile(file="a.gguf", bytes=10, released=True),
        FileCacheFile(file="b.gguf", bytes=5, released=False, why="another Werk reader holds a lease"),
    ]
    text = render_table(Deployments(inventory=[inventory(InstanceFileCache(mode="on", release=True, leased_files=0,
                                                                            last_release=files))], plans=[], slots=[]))  # fmt: skip
    assert (
        "m: file cache released for 1 of 2 file(s), 10 bytes (kept b.gguf: another Werk reader holds a lease)" in text
    )
    kept = InstanceFileCache(mode="auto", release=False, leased_files=0, last_release=files[1:])
    text = render_table(Deployments(inventory=[inventory(kept)], plans=[], slots=[]))
    assert "m: file cache kept at the last unload (model_cache_release auto)" in text
    assert "file cache" not in render_table(Deployments(inventory=[inventory(None)], plans=[], slots=[]))

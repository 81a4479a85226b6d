"""A full filesystem (docs/states.md, "A full disk"): every failed write removes its staging and
temporary files at once, and acknowledged commits stay intact.

The filesystem is real: a tmpfs of a few MiB mounted for the test (root only; skipped with the
reason where mounting is not permitted), filled to the last byte with a filler file.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from werk_host.errors import ErrorCode, WerkError
from werk_host.store import StateStore

from .helpers import ENV, P1, P2, commit, payload_for, read_payload

SIZE = "4m"


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A freshly mounted tmpfs of :data:`SIZE`, unmounted afterwards."""
    mnt = tmp_path / "small-fs"
    mnt.mkdir()
    if shutil.which("mount") is None or shutil.which("umount") is None:
        pytest.skip("no mount/umount executables to make a small real filesystem")
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={SIZE},mode=0700", f"werk-test-{uuid.uuid4().hex[:8]}", str(mnt)],
            capture_output=True,
            timeout=30,
            check=False,
        )
    except OSError as exc:
        pytest.skip(f"cannot run mount: {exc}")
    if done.returncode != 0:
        pytest.skip(f"mounting a small tmpfs is not permitted here: {done.stderr.decode(errors='replace').strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=30, check=False)


@pytest.fixture
def fs_store(small_fs: Path) -> StateStore:
    return StateStore(small_fs / "werk-home" / "runtime-state" / "v1")


def fill(path: Path) -> Path:
    """Write a filler file next to the store until the filesystem refuses even one byte."""
    filler = path / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for size in (1 << 16, 1 << 12, 1 << 8, 1):
            block = b"\0" * size
            while True:
                try:
                    if os.write(fd, block) < size:
                        break
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC
                    break
    finally:
        os.close(fd)
    probe = path / "probe"
    with pytest.raises(OSError) as info:
        probe.write_bytes(b"x")
    assert info.value.errno == errno.ENOSPC
    probe.unlink(missing_ok=True)
    return filler


def leftovers(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.name.startswith((".staging-", ".tmp-")))


def intact(store: StateStore, principal: str, acked: dict[str, bytes]) -> None:
    """Every acknowledged commit still lists, verifies and reads back byte for byte."""
    listed = {r.id for r in store.list_states(principal)[0]}
    assert listed == set(acked)
    for sid, data in acked.items():
        assert store.verify(principal, sid)
        assert read_payload(store, principal, sid) == data


def test_a_read_on_a_full_filesystem_leaves_no_temporary_access_time_file(small_fs: Path, fs_store: StateStore) -> None:
    """Recording ``last-accessed`` after a read writes a ``.tmp-*`` file and renames it; on
    ENOSPC that file is removed at once, not left for the next reconciliation."""
    root = small_fs / "werk-home" / "runtime-state" / "v1"
    acked = {commit(fs_store, P1, payload_for(i, 100_000)).id: payload_for(i, 100_000) for i in range(2)}
    fill(small_fs)
    for sid, data in acked.items():
        assert read_payload(fs_store, P1, sid) == data  # the read itself succeeds
    assert leftovers(root) == []
    intact(fs_store, P1, acked)


def test_a_commit_that_runs_out_of_space_mid_payload_leaves_nothing(small_fs: Path, fs_store: StateStore) -> None:
    root = small_fs / "werk-home" / "runtime-state" / "v1"
    acked = {commit(fs_store, P1, payload_for(1, 50_000)).id: payload_for(1, 50_000)}
    with pytest.raises(WerkError) as info:
        commit(fs_store, P1, payload_for(2, 8 << 20))  # twice the filesystem
    assert info.value.code is ErrorCode.RESOURCE_EXHAUSTED and info.value.retryable
    assert leftovers(root) == []
    intact(fs_store, P1, acked)
    assert commit(fs_store, P2, b"room again").id  # the failed commit's bytes were freed


def test_a_commit_whose_metadata_finds_the_disk_full_leaves_nothing(small_fs: Path, fs_store: StateStore) -> None:
    """The payload is staged whole, then the filesystem fills before the metadata is written."""
    root = small_fs / "werk-home" / "runtime-state" / "v1"
    acked = {commit(fs_store, P1, payload_for(1, 50_000)).id: payload_for(1, 50_000)}
    fillers: list[Path] = []

    def payload() -> Iterator[bytes]:
        yield payload_for(3, 50_000)
        fillers.append(fill(small_fs))  # after the last chunk: nothing is left for metadata.json

    with pytest.raises(WerkError) as info:
        fs_store.commit(P1, model_id="m", backend="b", compat_key=ENV, payload=payload())
    assert info.value.code is ErrorCode.RESOURCE_EXHAUSTED
    assert fillers
    assert leftovers(root) == []
    fillers[0].unlink()
    intact(fs_store, P1, acked)

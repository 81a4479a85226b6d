"""Werk's llama.cpp snapshot format (slot file | trailer) and how a payload reaches llama-server."""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from werk_llamacpp import snapshot
from werk_llamacpp.snapshot import SlotImage, presented, read_image

from werk_host.plugin import ErrorCode, WerkError

SLOT = bytes(range(256)) * 40  # stands in for llama-server's slot file
DIGEST = "d" * 64  # stands in for the tokens' keyed digest


@pytest.fixture
def payload(tmp_path: Path) -> Iterator[tuple[int, int]]:
    image = SlotImage([5, 6, 7], 3, len(SLOT), DIGEST)
    path = tmp_path / "payload.bin"
    path.write_bytes(SLOT + image.trailer())
    fd = os.open(path, os.O_RDONLY)
    try:
        yield fd, path.stat().st_size
    finally:
        os.close(fd)


def corrupt_image(tmp_path: Path, data: bytes) -> str:
    path = tmp_path / "bad.bin"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(WerkError) as err:
            read_image(fd, len(data))
    finally:
        os.close(fd)
    assert err.value.code is ErrorCode.CORRUPT_STATE
    return err.value.message


def test_trailer_round_trip(payload: tuple[int, int]) -> None:
    fd, size = payload
    image = read_image(fd, size)
    assert image == SlotImage([5, 6, 7], 3, len(SLOT), DIGEST)
    assert image.size() == size


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"short", "not a llama.cpp Werk snapshot"),
        (SLOT + b"no trailer at all", "not a llama.cpp Werk snapshot"),
        (SLOT + b"{}" + (10**6).to_bytes(4, "big") + snapshot.MAGIC, "out of bounds"),
        (SLOT + b"{[" + (2).to_bytes(4, "big") + snapshot.MAGIC, "malformed"),
        (SLOT + SlotImage([1, 2], 3, len(SLOT), DIGEST).trailer(), "does not match"),  # n_saved != tokens
        (SLOT + SlotImage([1], 1, len(SLOT) + 1, DIGEST).trailer(), "does not match"),  # sizes do not add up
        (SlotImage([], 0, 0, DIGEST).trailer(), "does not match"),  # no slot bytes at all
    ],
)
def test_malformed_trailers_are_corrupt_state(tmp_path: Path, data: bytes, why: str) -> None:
    assert why in corrupt_image(tmp_path, data)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc/<pid>/fd")
def test_presented_links_the_open_descriptor_without_copying(tmp_path: Path, payload: tuple[int, int]) -> None:
    fd, _ = payload
    slots = tmp_path / "slots"
    slots.mkdir(mode=0o700)
    with presented(slots, fd, len(SLOT)) as name:
        entry = slots / name
        assert entry.is_symlink() and os.readlink(entry) == f"/proc/{os.getpid()}/fd/{fd}"
        assert entry.read_bytes()[: len(SLOT)] == SLOT  # another opener sees the verified inode
    assert list(slots.iterdir()) == []


def test_presented_copies_the_slot_bytes_where_no_link_exists(
    tmp_path: Path, payload: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(snapshot, "_fd_link", lambda fd: None)
    fd, _ = payload
    slots = tmp_path / "slots"
    slots.mkdir(mode=0o700)
    with presented(slots, fd, len(SLOT)) as name:
        entry = slots / name
        assert not entry.is_symlink() and entry.read_bytes() == SLOT  # the slot file only, no trailer
        assert stat.S_IMODE(entry.stat().st_mode) == 0o600
    assert list(slots.iterdir()) == []
    with pytest.raises(WerkError) as err, presented(slots, fd, os.fstat(fd).st_size + 1):
        pass
    assert err.value.code is ErrorCode.CORRUPT_STATE
    assert list(slots.iterdir()) == []

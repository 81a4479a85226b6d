"""Shared helpers for runtime-state store tests (real files, no mocks)."""

from __future__ import annotations

import io
import os
import random
import stat
from pathlib import Path
from typing import Any

from werk_host.store import StateRecord, StateStore

P1 = "a1" * 16
P2 = "b2" * 16
ENV = {"backend_fingerprint": "bin-1", "process_generation": "gen-1"}


class FakeClock:
    """Unix-seconds clock the test advances explicitly."""

    def __init__(self, start: float = 1_788_444_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def payload_for(seed: int, size: int) -> bytes:
    """Deterministic payload bytes for ``seed`` (checkable by content, not only by hash)."""
    return random.Random(seed).randbytes(size)


def commit(store: StateStore, principal: str = P1, data: bytes = b"state-bytes", **kw: Any) -> StateRecord:
    kw.setdefault("model_id", "tiny-model")
    kw.setdefault("backend", "llamacpp")
    kw.setdefault("compat_key", ENV)
    return store.commit(principal, payload=io.BytesIO(data), **kw)


def read_payload(store: StateStore, principal: str, state_id: str) -> bytes:
    with store.open_payload(principal, state_id) as f:
        return f.read()


Snapshot = dict[str, tuple[str, int, int, int]]


def snapshot(path: Path) -> Snapshot:
    """Every entry below (and including) ``path``: type, size, mtime_ns, mode; links not followed."""
    out: Snapshot = {}
    if not os.path.lexists(path):
        return out

    def kind(st: os.stat_result) -> str:
        if stat.S_ISLNK(st.st_mode):
            return "link"
        if stat.S_ISDIR(st.st_mode):
            return "dir"
        return "file"

    st = os.lstat(path)
    out["."] = (kind(st), st.st_size, st.st_mtime_ns, st.st_mode)
    for dirpath, dirnames, filenames in os.walk(path, followlinks=False):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            out[os.path.relpath(full, path)] = (kind(st), st.st_size, st.st_mtime_ns, st.st_mode)
    return out


def state_dir(root: Path, principal: str, state_id: str) -> Path:
    return root / f"p_{principal}" / state_id


def quarantined(root: Path) -> list[str]:
    """Original state directory names of the entries in ``.quarantine`` (sorted)."""
    qdir = root / ".quarantine"
    if not qdir.is_dir() or qdir.is_symlink():
        return []
    return sorted(name.split("-", 3)[-1] for name in os.listdir(qdir))


def staging_leftovers(root: Path) -> list[str]:
    found: list[str] = []
    if not root.exists():
        return found
    for pdir in root.iterdir():
        if pdir.name.startswith("p_") and pdir.is_dir() and not pdir.is_symlink():
            found += [e.name for e in pdir.iterdir() if e.name.startswith(".staging-")]
    return found

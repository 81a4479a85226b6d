"""The model-lifetime guard: leases on a model's exact files, and releasing their page cache.

docs/operations.md, "Model file cache". The contract:

* **Leased while an owner lives.** :meth:`ModelFiles.lease` opens each file read-only and takes
  a *shared* advisory lease on it (``flock(LOCK_SH)``), bounded: a file whose lease is not
  granted within :data:`LEASE_TIMEOUT_S` (another reader is releasing it at that moment) stays
  open without one, and the owner runs without the release guarantee for that file. It never
  fails a start: a file that cannot even be opened is recorded as not leased.
* **Released after the owner is gone.** :meth:`ModelFiles.release` is called once the owner
  (a native child, a worker, in-process weights) has been destroyed or reaped. With ``advise``
  it asks, per file, for a *non-blocking exclusive* lease on the same open file (an upgrade of
  its own shared one); granted only when no other Werk reader holds a shared lease, it then
  checks that the file is unchanged since it was leased (same device, inode, size and
  modification time, and the path still names it) and gives ``POSIX_FADV_DONTNEED`` for the
  whole file. Every other case is a skip with its reason (:data:`SKIP_REASONS`); none is an
  error. Then every descriptor closes, which drops every lease.
* **What it does not promise** (the kernel decides): clean pages of files nobody maps are
  dropped; pages that another process maps, dirty or locked pages stay. Applications other than
  Werk take no part in these leases. A process killed with SIGKILL releases nothing, and its
  leases vanish with its descriptors, so nothing is left behind for the next start.

:func:`release_enabled` reads the switch (``WERK_MODEL_CACHE_RELEASE``, a profile's
``model_cache_release``, ``werk serve --model-cache-release``): ``on``, ``off``, or ``auto``
(on under WSL only, where a Linux VM's page cache holds the host's memory).
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

__all__ = [
    "LEASE_TIMEOUT_S",
    "ENV",
    "MODES",
    "SKIP_REASONS",
    "FileOutcome",
    "ModelFiles",
    "ReleaseReport",
    "on_wsl",
    "release_enabled",
    "release_mode",
]

ReleaseMode = Literal["auto", "on", "off"]
MODES: tuple[ReleaseMode, ...] = ("auto", "on", "off")
#: The switch's environment variable.
ENV = "WERK_MODEL_CACHE_RELEASE"
#: The longest wait for a shared lease at start (only a release in progress holds it exclusively).
LEASE_TIMEOUT_S = 0.5
_RETRY_S = 0.01
#: Why a file's cache was not released.
SKIP_REASONS = {
    "off": "release is off",
    "unleased": "no lease was granted at start",
    "shared": "another Werk reader holds a lease",
    "changed": "the file changed since it was leased",
    "advice": "the kernel refused the advice",
}


def on_wsl() -> bool:
    """Whether this is Linux under WSL (its kernel names Microsoft, or WSL set its variables)."""
    if os.environ.get("WSL_DISTRO_NAME") or os.environ.get("WSL_INTEROP"):
        return True
    try:
        return "microsoft" in Path("/proc/sys/kernel/osrelease").read_text().lower()
    except OSError:
        return False


def release_mode(*chosen: str | None) -> ReleaseMode:
    """The first of ``chosen`` that is set (a profile entry's, then the host's), else
    :data:`ENV`, else ``auto``; ``ValueError`` naming the bad value otherwise."""
    mode = next((c for c in chosen if c is not None), None) or os.environ.get(ENV) or "auto"
    for known in MODES:
        if mode == known:
            return known
    raise ValueError(f"model cache release must be one of {', '.join(MODES)}, not {mode!r}")


def release_enabled(mode: str) -> bool:
    """``on`` and ``off`` as said; ``auto``: under WSL only. ``ValueError`` for anything else."""
    if mode not in MODES:
        raise ValueError(f"model cache release must be one of {', '.join(MODES)}, not {mode!r}")
    return mode == "on" or (mode == "auto" and on_wsl())


@dataclass(frozen=True)
class FileOutcome:
    """One file at release: its name (never its directory), size, and why it was skipped."""

    name: str
    bytes: int
    skipped: str | None = None  # a key of SKIP_REASONS; None: released

    def as_dict(self) -> dict[str, object]:
        why = None if self.skipped is None else SKIP_REASONS[self.skipped]
        return {"file": self.name, "bytes": self.bytes, "released": self.skipped is None, "why": why}


@dataclass(frozen=True)
class ReleaseReport:
    """What a release did, for the instance log and ``werk deployments``."""

    enabled: bool
    files: tuple[FileOutcome, ...] = ()

    @property
    def released(self) -> tuple[FileOutcome, ...]:
        return tuple(f for f in self.files if f.skipped is None)

    @property
    def skipped(self) -> tuple[FileOutcome, ...]:
        return tuple(f for f in self.files if f.skipped is not None)

    def summary(self) -> str:
        if not self.enabled:
            return "file cache kept (release is off)"
        released = sum(f.bytes for f in self.released)
        text = f"file cache released for {len(self.released)} file(s), {released} bytes"
        if self.skipped:
            whys = sorted({SKIP_REASONS[f.skipped or ""] for f in self.skipped})
            text += f"; {len(self.skipped)} skipped ({'; '.join(whys)})"
        return text

    def as_dict(self) -> dict[str, object]:
        return {"enabled": self.enabled, "files": [f.as_dict() for f in self.files]}


@dataclass
class _Held:
    path: Path
    fd: int | None
    leased: bool
    stat: os.stat_result | None


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _shared_lease(fd: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(_RETRY_S)
        except OSError:
            return False


@dataclass
class ModelFiles:
    """Descriptors and shared leases on one owner's exact model files (the module docstring)."""

    held: list[_Held] = field(default_factory=list)

    @classmethod
    def lease(cls, paths: Iterable[str | os.PathLike[str]], *, timeout_s: float = LEASE_TIMEOUT_S) -> ModelFiles:
        """Open and lease every path (duplicates once); never raises for a file."""
        held: list[_Held] = []
        for path in dict.fromkeys(Path(p) for p in paths):
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                held.append(_Held(path, None, False, None))
                continue
            held.append(_Held(path, fd, _shared_lease(fd, timeout_s), os.fstat(fd)))
        return cls(held)

    @property
    def leased(self) -> int:
        """How many files hold a shared lease."""
        return sum(1 for h in self.held if h.leased)

    def release(self, *, advise: bool) -> ReleaseReport:
        """After the owner is gone: drop each unchanged, unshared file's cache when ``advise``,
        then close every descriptor (idempotent: a second call reports no files)."""
        outcomes: list[FileOutcome] = []
        held, self.held = self.held, []
        for h in held:
            try:
                skipped = self._release_one(h) if advise else "off"
            finally:
                if h.fd is not None:
                    os.close(h.fd)  # drops the lease with the open file description
            size = h.stat.st_size if h.stat is not None else 0
            outcomes.append(FileOutcome(h.path.name, size, skipped))
        return ReleaseReport(advise, tuple(outcomes))

    @staticmethod
    def _release_one(h: _Held) -> str | None:
        if h.fd is None or not h.leased or h.stat is None:
            return "unleased"
        try:
            fcntl.flock(h.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return "shared"
        try:
            now, named = os.fstat(h.fd), os.stat(h.path)
        except OSError:
            return "changed"
        if not _identity(h.stat) == _identity(now) == _identity(named):
            return "changed"
        try:
            os.posix_fadvise(h.fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError:
            return "advice"
        return None

    def __del__(self) -> None:  # an owner dropped without release still closes its descriptors
        for h in self.held:
            if h.fd is not None:
                os.close(h.fd)
        self.held = []

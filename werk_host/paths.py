"""Where Werk keeps its files. ``WERK_HOME`` defaults to ``~/.werk``."""

from __future__ import annotations

import os
from pathlib import Path


def werk_home(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The Werk home directory (not created here)."""
    if explicit is not None:
        return Path(explicit).expanduser().absolute()
    env = os.environ.get("WERK_HOME")
    if env:
        return Path(env).expanduser().absolute()
    return Path.home() / ".werk"


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` (and parents) owner-only; refuse a symlink in its place."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    if path.is_symlink() or not path.is_dir():
        raise RuntimeError("refusing a non-directory or symlinked Werk directory")
    os.chmod(path, 0o700)
    return path

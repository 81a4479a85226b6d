"""Where Werk keeps its files. ``WERK_HOME`` defaults to ``~/.werk``."""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path


class PrivateDirError(RuntimeError):
    """A directory that must be private is a symlink, not a directory, or not ours."""


def werk_home(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The Werk home directory (not created here)."""
    if explicit is not None:
        return Path(explicit).expanduser().absolute()
    env = os.environ.get("WERK_HOME")
    if env:
        return Path(env).expanduser().absolute()
    return Path.home() / ".werk"


def ensure_private_dir(path: str | os.PathLike[str]) -> Path:
    """Create ``path`` (and parents) if needed and make it owner-only (0700); returns it as a :class:`Path`.

    Raises :class:`PrivateDirError` when ``path`` is a symlink or not a directory, or (where the
    platform has user ids) is owned by another user; no link is followed and nothing else changes.
    """
    p = Path(path)
    p.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(p)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise PrivateDirError(f"refusing {p}: a symlink or not a directory")
    if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
        raise PrivateDirError(f"refusing {p}: not owned by the current user")
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(p, 0o700)
    return p


def user_cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """``${XDG_CACHE_HOME:-$HOME/.cache}/werk``: where built runtimes and downloaded models are
    cached by version (never inside ``WERK_HOME``, which holds user data)."""
    e = os.environ if env is None else env
    xdg = e.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path(e.get("HOME") or Path.home()) / ".cache"
    return base / "werk"

"""The model-lifetime guard's file leases for backend plugins (docs/operations.md, "Model file
cache"): :mod:`werk_host.filecache`. The host leases every instance's manifest files
itself; a plugin leases what it keeps mapped beyond that (llama.cpp's expert page preparation)."""

from __future__ import annotations

from werk_host.filecache import ModelFiles, ReleaseReport

__all__ = ["ModelFiles", "ReleaseReport"]

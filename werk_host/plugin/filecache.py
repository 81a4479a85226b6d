"""The model-lifetime guard's file leases for backend plugins (docs/operations.md, "Model file
cache"): :mod:`werk_host.filecache`. The host leases every instance's manifest files
itself; a plugin leases what it reads or keeps mapped beyond that (llama.cpp's projector and split
shards, its expert page preparation), and releases it as ``release_enabled(release_mode(None,
config.model_cache_release))`` says: the ``HostConfig`` an adapter is created with carries its
instance's effective switch."""

from __future__ import annotations

from werk_host.filecache import ModelFiles, ReleaseReport, release_enabled, release_mode

__all__ = ["ModelFiles", "ReleaseReport", "release_enabled", "release_mode"]

"""The files a ``llama-server`` child reads beyond its manifest's, leased and released like them.

docs/operations.md, "Model file cache". The host leases the files of an instance's manifest
and releases their page cache after the adapter closed; a manifest names one GGUF. The
child may read more: the other shards of a split model (``<name>-0000K-of-0000N.gguf`` beside
the ``-m`` file, :func:`werk_llamacpp.prefetch.model_shards`) and a local multimodal projector
(``-mm``/``--mmproj``). :func:`extra_files` names them from the child's final argv;
:class:`ExtraFiles` holds the same shared leases (:class:`werk_host.plugin.filecache.ModelFiles`)
from before the child spawns until it has been reaped, and then releases them with advice when
the instance's switch says so (``HostConfig.model_cache_release``, which the host sets to the
instance's effective mode). Its outcome is one INFO line on ``werk_llamacpp.modelfiles``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from werk_host.plugin.filecache import ModelFiles, release_enabled, release_mode

from .prefetch import model_shards

__all__ = ["PROJECTOR_FLAGS", "ExtraFiles", "extra_files", "release_wanted"]

log = logging.getLogger(__name__)

#: The flags that name a local projector file.
PROJECTOR_FLAGS = ("-mm", "--mmproj")


def extra_files(argv: Sequence[str], model: Path) -> list[Path]:
    """The existing files beyond ``model`` that a child with ``argv`` reads (each once)."""
    found = [p for p in model_shards(model) if p != model]
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if name in PROJECTOR_FLAGS:
            path = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
            if path and Path(path).is_file():
                found.append(Path(path).absolute())
    return list(dict.fromkeys(found))


def release_wanted(mode: str | None) -> bool:
    """Whether the instance's switch (``HostConfig.model_cache_release``) releases here; an
    invalid value keeps the cache (the host refuses it before any instance starts)."""
    try:
        return release_enabled(release_mode(mode))
    except ValueError:
        return False


class ExtraFiles:
    """The leases of one child's files beyond its manifest (the module docstring)."""

    def __init__(self, argv: Sequence[str], model: Path, *, release: bool) -> None:
        self.paths = extra_files(argv, model)
        self.release = release
        self._files: ModelFiles | None = ModelFiles.lease(self.paths) if self.paths else None

    def close(self) -> None:
        """After the child was reaped: release (with advice when asked) and log it; idempotent."""
        files, self._files = self._files, None
        if files is not None:
            log.info("llama.cpp files beyond the manifest: %s", files.release(advise=self.release).summary())

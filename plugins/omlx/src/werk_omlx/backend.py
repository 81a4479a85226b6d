"""What the plugin module declares about the oMLX backend without importing its adapter: the
ids, the capabilities its adapters report on, its ``omlx.*`` options and which models it
accepts. ``werk serve`` loads every plugin to choose a model's backend;
:mod:`werk_omlx.adapter` is imported only once an oMLX instance is created
(docs/operations.md, "Start-up")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from werk_host.plugin import CapabilityId, ErrorCode, ModelManifest, WerkError
from werk_host.plugin.checkpoints import checkpoint_dir, safetensors_metadata

BACKEND_ID = "omlx"
PLUGIN_NAME = "omlx"
DEFAULT_MAX_WORKERS = 2
DEFAULT_STARTUP_TIMEOUT_S = 300.0
CHAT_CAPABILITIES = (CapabilityId.TOKEN_COUNT, CapabilityId.ADMISSION, CapabilityId.CHAT_LIMITS)
#: Every id :meth:`~werk_omlx.adapter.OmlxAdapter.capabilities` reports on (declared on the adapter factory).
REPORTED_CAPABILITIES = (
    CapabilityId.MODEL_RESIDENCY,
    CapabilityId.EXPERTS,
    CapabilityId.OMLX_OPTIONS,
    *CHAT_CAPABILITIES,
    CapabilityId.REASONING,
)


@dataclass(frozen=True)
class Settings:
    """The ``omlx.*`` backend options."""

    python: str | None = None
    executable: str | None = None
    startup_timeout: float = DEFAULT_STARTUP_TIMEOUT_S
    max_workers: int = DEFAULT_MAX_WORKERS

    @classmethod
    def parse(cls, options: dict[str, Any]) -> Settings:
        unknown = sorted(set(options) - {"python", "executable", "startup_timeout", "max_workers"})
        if unknown:
            raise WerkError(ErrorCode.INVALID_REQUEST, f"unknown omlx backend option(s): {', '.join(unknown)}")
        timeout = options.get("startup_timeout", DEFAULT_STARTUP_TIMEOUT_S)
        workers = options.get("max_workers", DEFAULT_MAX_WORKERS)
        try:
            timeout, workers = float(timeout), int(workers)
        except (TypeError, ValueError) as err:
            raise WerkError(ErrorCode.INVALID_REQUEST, "omlx.startup_timeout and omlx.max_workers are numbers") from err
        if timeout <= 0 or workers < 1:
            raise WerkError(ErrorCode.INVALID_REQUEST, "omlx.startup_timeout and omlx.max_workers must be positive")
        python, executable = options.get("python"), options.get("executable")
        return cls(
            python=str(python) if python else None,
            executable=str(executable) if executable else None,
            startup_timeout=timeout,
            max_workers=workers,
        )


def accepts(manifest: ModelManifest | None) -> bool:
    """A manifest pinned to oMLX, or an unpinned directory of an MLX checkpoint (``config.json``
    and ``*.safetensors`` whose metadata says ``format: mlx``)."""
    if manifest is None:
        return False
    if manifest.backend is not None:
        return manifest.backend in (BACKEND_ID, PLUGIN_NAME)
    directory = checkpoint_dir(manifest)
    metadata = safetensors_metadata(directory) if directory is not None else None
    return metadata is not None and metadata.get("format") == "mlx"

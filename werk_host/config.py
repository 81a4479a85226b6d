"""Host configuration assembled by ``werk serve`` (or a test) and handed to every layer."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from werk_host.protocol.pd import PersistenceMode, ReusePolicy


@dataclass(frozen=True)
class PersistenceDefaults:
    """Server-side Prefill defaults (``werk serve --persistence`` and its granular flags).

    They apply only to *absent* top-level members of a prefill request.
    """

    mode: PersistenceMode = PersistenceMode.AUTO
    reuse: ReusePolicy = ReusePolicy.PREFER
    ttl_seconds: int | None = None
    pin: bool = False


@dataclass(frozen=True)
class HostConfig:
    home: Path
    api_keys: tuple[str, ...] = ()
    host: str = "127.0.0.1"
    port: int = 11434
    threads: int = 8
    model: str | None = None
    persistence: PersistenceDefaults | None = None
    #: Backend-specific settings keyed by plugin name (e.g. ``{"llamacpp": {"llama_server": ...}}``).
    backend_options: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __repr__(self) -> str:  # never show keys
        return (
            f"HostConfig(home={str(self.home)!r}, api_keys=<{len(self.api_keys)} configured>, "
            f"host={self.host!r}, port={self.port}, model={self.model!r})"
        )

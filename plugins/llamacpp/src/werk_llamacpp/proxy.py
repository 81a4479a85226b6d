"""llama-server specifics of the host relay (:mod:`werk_host.plugin.http`).

OpenAI ``/v1`` requests reach the managed llama-server through
:func:`werk_host.plugin.http.forward` over a :class:`LlamaConnectionPool`: the host's pool
labelled ``llama-server`` in errors and tuned to llama-server's keep-alive timeout.
"""

from __future__ import annotations

from werk_host.plugin import BackendBounds
from werk_host.plugin.http import ConnectionPool

LABEL = "llama-server"
#: llama-server closes keep-alive connections idle for 5 s (``Keep-Alive: timeout=5``); the pool
#: drops them a little earlier instead of finding out by sending a request into a closed socket.
IDLE_REUSE_S = 4.0


class LlamaConnectionPool(ConnectionPool):
    """The host's :class:`~werk_host.plugin.http.ConnectionPool` for one llama-server child."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        size: int = 16,
        timeout: float = 600.0,
        api_key: str | None = None,
        bounds: BackendBounds | None = None,
    ) -> None:
        super().__init__(
            host,
            port,
            size=size,
            timeout=timeout,
            api_key=api_key,
            label=LABEL,
            idle_reuse_s=IDLE_REUSE_S,
            bounds=bounds,
        )

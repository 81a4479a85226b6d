"""HTTP to a vLLM server: the host relay's pool, plus small bounded ``GET``s.

Inference and ``/tokenize`` go through :class:`VllmPool` (the host's
:class:`~werk_host.backends.relay.ConnectionPool`, over TLS for an ``https://`` endpoint and
under the endpoint's path prefix). Every request carries ``Authorization: Bearer <key>`` when
the server has a key; the key is in no repr, log line or error. Health, ``/v1/models`` and
``/metrics`` are read with :func:`get` on a fresh connection with a short timeout, so a slow
inference cannot hold up discovery.
"""

from __future__ import annotations

import http.client
import json
import ssl
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from werk_host.plugin.http import ConnectionPool

__all__ = ["LABEL", "Endpoint", "VllmPool", "get", "get_json"]

LABEL = "vLLM"
#: vLLM's uvicorn closes keep-alive connections idle for 5 s.
IDLE_REUSE_S = 4.0
PROBE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Endpoint:
    """Where a vLLM server answers: scheme, host, port and path prefix (``""`` or ``/x``)."""

    tls: bool
    host: str
    port: int
    prefix: str = ""

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        """``http(s)://host[:port][/prefix]``; a trailing ``/v1`` is dropped (Werk adds it)."""
        parts = urlsplit(url)
        tls = parts.scheme == "https"
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("not an http:// or https:// URL")
        prefix = parts.path.rstrip("/")
        if prefix.endswith("/v1"):
            prefix = prefix[: -len("/v1")]
        return cls(tls, parts.hostname, parts.port or (443 if tls else 80), prefix)

    def connection(self, timeout: float) -> http.client.HTTPConnection:
        if self.tls:
            return http.client.HTTPSConnection(
                self.host, self.port, timeout=timeout, context=ssl.create_default_context()
            )
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)


class VllmPool(ConnectionPool):
    """The host's connection pool for one vLLM server (see the module docstring)."""

    def __init__(
        self, endpoint: Endpoint, *, api_key: str | None = None, timeout: float = 600.0, size: int = 16
    ) -> None:
        super().__init__(
            endpoint.host,
            endpoint.port,
            size=size,
            timeout=timeout,
            api_key=api_key,
            label=LABEL,
            idle_reuse_s=IDLE_REUSE_S,
        )
        self.endpoint = endpoint

    def acquire(self) -> tuple[http.client.HTTPConnection, bool]:
        conn, reused = super().acquire()
        if reused or not self.endpoint.tls:
            return conn, reused
        return self.endpoint.connection(self.timeout), False

    def path(self, path: str) -> str:
        """``path`` under the endpoint's prefix."""
        return self.endpoint.prefix + path

    def __repr__(self) -> str:
        return f"<VllmPool {self.endpoint.host}:{self.endpoint.port} idle={self.idle()}>"


def get(pool: VllmPool, path: str, *, timeout: float = PROBE_TIMEOUT_S) -> tuple[int, bytes] | None:
    """``GET path`` on a fresh connection: status and body, or ``None`` when the server does not answer."""
    conn = pool.endpoint.connection(timeout)
    try:
        conn.request("GET", pool.path(path), headers=dict(pool.auth_headers))
        response = conn.getresponse()
        return response.status, response.read()
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def get_json(pool: VllmPool, path: str, *, timeout: float = PROBE_TIMEOUT_S) -> dict[str, Any] | None:
    """The JSON object a ``GET`` answers with 200, else ``None``."""
    answer = get(pool, path, timeout=timeout)
    if answer is None or answer[0] != 200:
        return None
    try:
        data = json.loads(answer[1])
    except ValueError:
        return None
    return data if isinstance(data, dict) else None

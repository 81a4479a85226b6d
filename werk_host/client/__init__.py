"""The bundled Werk Protocol 1.0 client (loopback ``http://HOST:PORT`` only, bounded, no redirects)."""

from __future__ import annotations

from werk_host.client.client import (
    CLIENT_VERSION,
    DEFAULT_SERVER,
    DEFAULT_TIMEOUT,
    MAX_RESPONSE_BYTES,
    WerkProtocolClient,
)
from werk_host.client.errors import *  # noqa: F403
from werk_host.client.errors import __all__ as _errors_all
from werk_host.client.transport import Endpoint, parse_base_url

__all__ = [
    "CLIENT_VERSION",
    "DEFAULT_SERVER",
    "DEFAULT_TIMEOUT",
    "MAX_RESPONSE_BYTES",
    "Endpoint",
    "WerkProtocolClient",
    "parse_base_url",
    *_errors_all,
]

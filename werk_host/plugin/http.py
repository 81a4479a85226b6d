"""Relaying a backend's HTTP answers: a bounded connection pool per backend process and the
calls that forward a body and stream the answer back (docs/plugin-kit.md, "Relaying")."""

from __future__ import annotations

from werk_host.backends.relay import BackendCut, ClientGone, ConnectionPool, forward, post_json

__all__ = ["BackendCut", "ClientGone", "ConnectionPool", "forward", "post_json"]

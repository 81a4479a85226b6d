"""Relaying a backend's HTTP answers: a bounded connection pool per backend server and the
calls that forward a body and stream the answer back (docs/plugin-kit.md, "Relaying").

The signatures (every keyword after ``*`` optional):

* ``ConnectionPool(host, port, *, size=16, timeout=600.0, api_key=None, label="backend",
  idle_reuse_s=4.0, bounds=None, tls=None, prefix="")``: keep-alive connections to one
  server. ``api_key`` is sent as ``Authorization: Bearer``; ``label`` names the server in
  errors (``"<label> is not answering"``); ``bounds`` (a
  :class:`~werk_host.plugin.BackendBounds`, usually ``config.backend_bounds``) bounds the waits,
  else ``timeout`` does; ``tls`` (an :class:`ssl.SSLContext`) makes the connections HTTPS;
  ``prefix`` (``""`` or ``/a/b``) goes before every path sent. ``close()`` drops the idle
  connections.
* ``forward(pool, path, body) -> InferenceResponse``: POST the JSON ``body`` to
  ``pool.prefix + path`` and relay the answer, whatever its status, as it streams. Raises
  :class:`ClientGone` when the client leaves before the first byte, :class:`BackendSlow` when
  the first byte does not come within ``bounds.first_byte_s``, a retryable ``unavailable``
  when the server cannot be reached; the body iterator raises :class:`BackendCut` when the
  server breaks the answer off.
* ``post_json(pool, path, body, *, is_refusal=client_refusal) -> dict``: a bounded JSON call
  (``bounds.call_s``) answered with a JSON object and 200; a status ``is_refusal`` calls the
  client's fault is ``invalid_request``, anything else a retryable ``unavailable``.
* ``client_refusal(status) -> bool``: the default ``is_refusal`` (a 4xx other than 401, 403,
  408 and 429).

A server elsewhere (a URL, a key from the environment or a file, a probe, errors with their
reason) is :mod:`werk_host.plugin.remote`, built on these.
"""

from __future__ import annotations

from werk_host.backends.relay import (
    BackendCut,
    BackendSlow,
    ClientGone,
    ConnectionPool,
    client_refusal,
    forward,
    post_json,
)

__all__ = ["BackendCut", "BackendSlow", "ClientGone", "ConnectionPool", "client_refusal", "forward", "post_json"]

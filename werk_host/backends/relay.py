"""A pooled, streaming HTTP relay from Werk to a backend's local HTTP server.

Backend plugins that front a native OpenAI-compatible server (llama.cpp's ``llama-server``;
vLLM, oMLX) send their requests through one :class:`ConnectionPool` per server process. The
contract:

* **Pooling.** Keep-alive connections to one ``host:port``. A connection goes back to the pool
  only when its previous response was read to the end and the server did not announce a close;
  it is reused only while younger than ``idle_reuse_s`` (set it a little under the server's own
  keep-alive timeout), and only while the server has not closed it meanwhile (a non-blocking
  poll of the idle socket: readable means EOF or stray bytes, so the connection is dropped;
  llama-server closes after every streamed answer despite announcing keep-alive). A reused
  connection that still fails the way a connection closed by the server
  before it read the request fails (:data:`STALE`) is replaced by a fresh one and the request is
  sent again: it never ran. Anything else is never retried.
* **A spare.** When the server closes a connection after a complete answer (llama-server does
  after every stream), the relay connects one replacement ahead of the next request, unless a
  connection is already idle (:meth:`ConnectionPool.prepare`; at most one such connect runs at a
  time). The next request then skips the TCP connect and the server's accept. The spare is an
  idle keep-alive connection like any other: it ages out under ``idle_reuse_s``, and the server
  drops it after its own keep-alive timeout. A pool that was closed takes nothing back.
* **Authentication.** With ``api_key``, every request carries ``Authorization: Bearer <key>``;
  the key appears in no repr and no error.
* **TLS and a path prefix.** With ``tls`` (an :class:`ssl.SSLContext`), connections are HTTPS
  with that context (certificate and host name checked as the context says); with ``prefix``
  (``""`` or ``/a/b``), :func:`forward` and :func:`post_json` send ``prefix + path``, so a
  server behind ``https://host/openai/v1`` is one pool (werk_host/plugin/remote.py builds it).
* **Bounds** (docs/operations.md, "Backend failures"). With ``bounds``
  (:class:`~werk_host.config.BackendBounds`), :func:`post_json` waits at most ``call_s`` for
  its answer to begin, :func:`forward` at most ``first_byte_s``, and every read of a body at most
  ``idle_s``; without, ``timeout`` is all three. A wait that runs out closes the connection.
* **Errors.** A connection failure (refused, reset, timed out) is a retryable
  ``WerkError(unavailable, "<label> is not answering")``; an answer that does not begin within
  its bound is a retryable ``unavailable`` too. :func:`post_json` maps a status that
  ``is_refusal`` calls the client's fault (default :func:`client_refusal`: a 4xx other than
  401, 403, 408 and 429) to ``invalid_request`` with a fixed message (the backend's own text
  goes to the log only), and every other non-200 status or non-object body to a retryable
  ``unavailable``. :func:`forward` relays any status as it is.
* **Streaming.** :func:`forward` returns the response as an
  :class:`~werk_host.seam.InferenceResponse` whose body yields chunks as the server sends
  them (server-sent events included), never buffered whole; only the headers in
  :data:`PASSED_HEADERS` are relayed. Each body read takes what the socket holds, up to
  :data:`READ_CHUNK` bytes, and yields it as one chunk, so events that arrived together leave
  together; a chunked body's framing is undone by :func:`_dechunk` over those reads, one pass
  per read rather than several calls per chunk (docs/operations.md, "Where relay time goes").
  What stays in memory per response is bounded by :data:`READ_CHUNK` plus one chunk-size line.
  A body the server breaks off (connection closed or reset before its end, a chunked body
  without its last chunk or with broken framing, fewer bytes than its ``content-length``, a
  read past ``idle_s``) raises :class:`BackendCut` from the body
  iterator, a retryable ``unavailable`` with a fixed message: the relaying route ends its
  answer with it (werk_host/http/openai.py).
* **Pumping.** A chunked answer's response carries its socket as ``source``
  (:class:`werk_host.seam.Pumpable`), so that the serving layer's event loop can drive its body
  instead of the request's thread (werk_host/pump.py). While pumped, the socket does not block:
  the body first passes on what ``http.client`` buffered with the headers, then reads the socket
  directly, and yields ``b""`` when it holds nothing; a silence of ``idle_s`` that the loop
  reports (``expire``) ends it with :class:`BackendCut`, as a timed-out read would. Closing the
  response puts the socket back in blocking mode before the connection is pooled.
* **Cancellation.** Closing the response before its end closes the upstream connection, which
  a server takes as its client going away (llama-server and vLLM then cancel the generation).
  While waiting for the first response byte, :func:`forward` polls
  :data:`werk_host.seam.client_disconnected` every :data:`WATCH_INTERVAL_S`; when the client
  has gone it closes the upstream connection and raises :class:`ClientGone`.
"""

from __future__ import annotations

import http.client
import io
import json
import logging
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from werk_host.config import BackendBounds
from werk_host.errors import ErrorCode, WerkError
from werk_host.seam import InferenceResponse, client_disconnected

__all__ = [
    "IDLE_REUSE_S",
    "PASSED_HEADERS",
    "READ_CHUNK",
    "STALE",
    "WATCH_INTERVAL_S",
    "BackendCut",
    "BackendSlow",
    "ClientGone",
    "ConnectionPool",
    "client_refusal",
    "forward",
    "post_json",
]

log = logging.getLogger(__name__)

READ_CHUNK = 64 * 1024
#: The longest chunk-size line (with extensions) or trailer line accepted in a chunked body.
MAX_CHUNK_LINE = 4096
#: ``content-length`` too: a non-streamed answer then leaves waitress unchunked, which saves the
#: client a round of chunk framing. Event streams keep the server's "do not buffer me" hints for
#: proxies in front of Werk.
PASSED_HEADERS = ("content-type", "content-length", "cache-control", "x-accel-buffering")
WATCH_INTERVAL_S = 0.1
#: Default for :attr:`ConnectionPool.idle_reuse_s`: common local servers (llama-server, uvicorn
#: under vLLM) close keep-alive connections idle for 5 s.
IDLE_REUSE_S = 4.0
#: Failures that show a reused keep-alive connection had been closed by the server before it
#: read our request, so sending it again on a fresh connection cannot run it twice.
STALE = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)
_CONNECTION_ERRORS = (ConnectionError, http.client.HTTPException, OSError)


class ConnectionPool:
    """Keep-alive connections to one ``host:port`` (see the module docstring).

    ``label`` names the backend in errors and log lines (``"llama-server is not answering"``).
    ``bounds`` sets the waits (module docstring); without it, ``timeout`` bounds each of them.
    ``tls`` makes every connection HTTPS with that context; ``prefix`` is put before every path
    :func:`forward` and :func:`post_json` send (module docstring, "TLS and a path prefix").
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        size: int = 16,
        timeout: float = 600.0,
        api_key: str | None = None,
        label: str = "backend",
        idle_reuse_s: float = IDLE_REUSE_S,
        bounds: BackendBounds | None = None,
        tls: ssl.SSLContext | None = None,
        prefix: str = "",
    ) -> None:
        if prefix and (not prefix.startswith("/") or prefix.endswith("/")):
            raise ValueError("a path prefix starts with / and does not end with one")
        if bounds is not None:
            timeout = bounds.idle_s
        self.tls, self.prefix = tls, prefix
        self.host, self.port, self.size, self.timeout = host, port, size, timeout
        #: the longest wait for an answer to begin: a :func:`post_json` call, a :func:`forward`
        self.call_timeout = bounds.call_s if bounds is not None else timeout
        self.first_byte_timeout = bounds.first_byte_s if bounds is not None else timeout
        self.label = label
        self.idle_reuse_s = idle_reuse_s
        self.auth_headers: dict[str, str] = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._idle: list[tuple[float, http.client.HTTPConnection]] = []
        self._lock = threading.Lock()
        self._preparing = False
        self._closed = False

    def acquire(self) -> tuple[http.client.HTTPConnection, bool]:
        """A connection (the most recently released young one, else a new one) and whether it is reused."""
        stale: list[http.client.HTTPConnection] = []
        conn = None
        with self._lock:
            now = time.monotonic()
            while self._idle:
                since, candidate = self._idle.pop()
                if now - since < self.idle_reuse_s and _still_open(candidate):
                    conn = candidate
                    break
                stale.append(candidate)
        for old in stale:
            old.close()
        if conn is not None:
            return conn, True
        return self.connection(), False

    def connection(self, timeout: float | None = None) -> http.client.HTTPConnection:
        """A new, unconnected connection to the server (HTTPS with ``tls``); ``timeout``
        defaults to the pool's."""
        wait = self.timeout if timeout is None else timeout
        if self.tls is not None:
            return http.client.HTTPSConnection(self.host, self.port, timeout=wait, context=self.tls)
        return http.client.HTTPConnection(self.host, self.port, timeout=wait)

    def release(self, conn: http.client.HTTPConnection) -> None:
        """Give back a connection whose response was read to the end (closed when the pool is
        full or closed)."""
        with self._lock:
            if len(self._idle) < self.size and not self._closed:
                self._idle.append((time.monotonic(), conn))
                return
        conn.close()

    def prepare(self) -> None:
        """Connect one spare connection for the next request, unless one is idle or being
        connected already (module docstring). A failed connect is dropped silently: the next
        request connects, and reports a failure, itself."""
        with self._lock:
            if self._idle or self._preparing or self._closed:
                return
            self._preparing = True
        try:
            conn = self.connection()
            try:
                conn.connect()
            except OSError:
                conn.close()
                return
            self.release(conn)
        finally:
            with self._lock:
                self._preparing = False

    def idle(self) -> int:
        with self._lock:
            return len(self._idle)

    def close(self) -> None:
        """Close every idle connection and take none back (connections in use close when their
        response does)."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for _, conn in idle:
            conn.close()

    def unavailable(self) -> WerkError:
        return WerkError(ErrorCode.UNAVAILABLE, f"{self.label} is not answering", retryable=True)

    def too_slow(self, bound: float) -> BackendSlow:
        return BackendSlow(f"{self.label} did not answer within {bound:g} s")

    def __repr__(self) -> str:
        return f"<ConnectionPool {self.label} {self.host}:{self.port} idle={self.idle()}>"


def _still_open(conn: http.client.HTTPConnection) -> bool:
    """Whether an idle keep-alive connection may still be used: connected, nothing to read.

    An idle connection has no response pending, so a readable socket means the server closed
    it (EOF) or sent bytes nobody asked for; either way it is not reused. ``poll`` rather
    than ``select``: descriptors may lie past ``FD_SETSIZE``.
    """
    sock = conn.sock
    if sock is None:
        return False
    poller = select.poll()
    poller.register(sock, select.POLLIN | select.POLLPRI | select.POLLERR | select.POLLHUP)
    return not poller.poll(0)


class BackendCut(WerkError):
    """The backend broke off a response it had begun (module docstring, "Streaming")."""

    def __init__(self, label: str) -> None:
        super().__init__(ErrorCode.UNAVAILABLE, f"{label} stopped answering before the end", retryable=True)


class BackendSlow(WerkError):
    """The backend did not answer within a bound (the connection is closed): it is alive but
    unresponsive, so a caller should not spend another bound on it in the same request."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.UNAVAILABLE, message, retryable=True)


class _NoAnswer(Exception):
    """The answer did not begin within its bound (the request may have run: never retried)."""


class ClientGone(WerkError):
    """The client disconnected before the upstream answered; the upstream request was closed."""

    def __init__(self) -> None:
        super().__init__(ErrorCode.UNAVAILABLE, "the client disconnected; the request was cancelled", retryable=True)


def client_refusal(status: int) -> bool:
    """Default ``is_refusal``: a 4xx that refuses the request itself (not our key, not a timeout or rate limit)."""
    return 400 <= status < 500 and status not in (401, 403, 408, 429)


def _await_answer(conn: http.client.HTTPConnection, gone: Callable[[], bool] | None, bound: float) -> None:
    """Block until the upstream socket is readable; raise :class:`ClientGone` if the client leaves
    first, :class:`_NoAnswer` after ``bound`` seconds. (Nothing is buffered yet: the response
    object does not exist.)"""
    sock = conn.sock
    if sock is None:
        return
    poller = select.poll()
    poller.register(sock, select.POLLIN | select.POLLPRI | select.POLLERR | select.POLLHUP)
    deadline = time.monotonic() + bound
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise _NoAnswer()
        wait = min(left, WATCH_INTERVAL_S) if gone is not None else left
        if poller.poll(max(wait * 1000, 1)):
            return
        if gone is not None and gone():
            raise ClientGone()


def post_json(
    pool: ConnectionPool,
    path: str,
    body: dict[str, Any],
    *,
    is_refusal: Callable[[int], bool] = client_refusal,
) -> dict[str, Any]:
    """POST ``body`` as JSON to ``pool.prefix + path`` over a pooled connection; the (small) JSON
    object answered with 200. ``is_refusal(status)`` says which statuses are the client's fault
    (``invalid_request``; default :func:`client_refusal`).

    Errors as in the module docstring."""
    payload = json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **pool.auth_headers}
    while True:
        conn, reused = pool.acquire()
        try:
            conn.request("POST", pool.prefix + path, body=payload, headers=headers)
            _await_answer(conn, None, pool.call_timeout)
            response = conn.getresponse()
            raw = response.read()
            break
        except _NoAnswer:
            conn.close()
            raise pool.too_slow(pool.call_timeout) from None
        except _CONNECTION_ERRORS as err:
            conn.close()
            if reused and isinstance(err, STALE):
                continue
            raise pool.unavailable() from err
    if response.will_close:
        conn.close()
    else:
        pool.release(conn)
    if response.status != 200 and is_refusal(response.status):
        # The backend refused the request itself (bad messages, unsupported content parts): the
        # client's error, not a failing backend; its own message stays in our log only.
        log.info("%s %s refused a request (%s): %.300r", pool.label, path, response.status, raw)
        raise WerkError(ErrorCode.INVALID_REQUEST, "the backend refused this request as invalid")
    try:
        data = json.loads(raw) if response.status == 200 else None
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise WerkError(ErrorCode.UNAVAILABLE, f"{pool.label} {path} failed ({response.status})", retryable=True)
    return data


def forward(pool: ConnectionPool, path: str, body: dict[str, Any]) -> InferenceResponse:
    """POST ``body`` to ``pool.prefix + path`` upstream and relay the response, any status, as it
    streams (module docstring): an :class:`~werk_host.seam.InferenceResponse` whose ``close``
    closes the upstream connection when the body was not read to its end."""
    payload = json.dumps(body).encode()
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        **pool.auth_headers,
    }
    gone = client_disconnected.get()
    while True:
        conn, reused = pool.acquire()
        try:
            conn.request("POST", pool.prefix + path, body=payload, headers=headers)
            _await_answer(conn, gone, pool.first_byte_timeout)
            sock = conn.sock  # http.client lets go of it for an answer that closes the connection
            response = conn.getresponse()
            break
        except ClientGone:
            conn.close()  # the server sees its client go and cancels the task
            raise
        except _NoAnswer:
            conn.close()  # as for a client that left: the server stops the task
            raise pool.too_slow(pool.first_byte_timeout) from None
        except _CONNECTION_ERRORS as err:
            conn.close()
            if reused and isinstance(err, STALE):
                continue  # the server had closed this keep-alive connection: it never ran the request
            raise pool.unavailable() from err
    state = {"done": False, "closed": False}
    chunked = response.chunked and response.fp is not None and sock is not None
    source = _Source(sock, response.fp, pool.timeout) if chunked else None

    def body_iter() -> Iterator[bytes]:
        if source is not None:
            yield from _dechunk(response, source.read, pool.label)
            state["done"] = True
            return
        while True:
            try:
                chunk = response.read1(READ_CHUNK)
            except _CONNECTION_ERRORS as err:  # reset, timed out
                raise BackendCut(pool.label) from err
            if not chunk:
                if response.length:  # read1() returns b"" at EOF short of content-length
                    raise BackendCut(pool.label)
                state["done"] = True
                return
            yield chunk

    def close() -> None:
        if state["closed"]:
            return
        state["closed"] = True
        if source is not None:
            source.pumped(False)  # a pooled connection blocks, within its bounds
        if not state["done"]:
            conn.close()  # early close: the upstream sees the disconnect and stops generating
            return
        if not response.will_close:
            # read1() does not close a fully read Content-Length response by itself, and
            # http.client refuses the next request on a connection whose response is open.
            response.close()
            if _still_open(conn):
                pool.release(conn)
                return
        conn.close()  # the server closes after this answer: connect the next request's now
        pool.prepare()

    relayed = {k: v for k, v in response.getheaders() if k.lower() in PASSED_HEADERS}
    return InferenceResponse(status=response.status, headers=relayed, body=body_iter(), close=close, source=source)


class _Source:
    """A chunked answer's upstream socket, for an event loop to drive (module docstring,
    "Pumping"; :class:`werk_host.seam.Pumpable`)."""

    __slots__ = ("fp", "sock", "idle_s", "_on", "_drained", "_expired")

    def __init__(self, sock: socket.socket, fp: io.BufferedReader, idle_s: float) -> None:
        self.fp, self.sock, self.idle_s = fp, sock, idle_s
        self._on = self._drained = self._expired = False

    def fileno(self) -> int:
        return int(self.sock.fileno())

    def pumped(self, on: bool) -> None:
        if on == self._on or self.sock.fileno() < 0:  # closed
            return
        self._on, self._drained, self._expired = on, False, False
        self.sock.settimeout(0.0 if on else self.idle_s)

    def expire(self) -> None:
        self._expired = True

    def read(self) -> bytes | None:
        """What the socket holds (``b""`` at its end), or ``None`` when pumped and it holds nothing."""
        if not self._on:
            return self.fp.read1(READ_CHUNK)
        if self._expired:
            raise TimeoutError()
        if not self._drained:  # first what http.client buffered with the headers
            data = self.fp.read1(READ_CHUNK)  # buffered bytes, else one read: b"" says nothing, or the end
            if data:
                return data
            self._drained = True
        try:
            got: bytes = self.sock.recv(READ_CHUNK)
        except BlockingIOError:
            return None
        return got


_SIZE, _DATA, _CRLF, _TRAILER = range(4)


def _dechunk(response: http.client.HTTPResponse, read: Callable[[], bytes | None], label: str) -> Iterator[bytes]:
    """The payload of ``response``'s chunked body, one piece per ``read()`` of the socket (module
    docstring, "Streaming"); raises :class:`BackendCut` for a body that ends (or breaks its
    framing) before its last chunk and trailers. Yields ``b""`` when ``read()`` says the socket
    holds nothing (``None``: pumped, module docstring). Returns after the body's last byte, with
    the connection positioned for its next response; ``response`` is marked read to the end (and
    ``will_close`` when bytes followed the body, so that the connection is not reused)."""
    pending = b""
    phase, left = _SIZE, 0
    while True:
        try:
            data = read()
        except _CONNECTION_ERRORS as err:  # reset, timed out
            raise BackendCut(label) from err
        if data is None:
            yield b""
            continue
        if not data:
            raise BackendCut(label)
        pending = pending + data if pending else data
        pieces: list[bytes] = []
        pos, end = 0, len(pending)
        while pos < end:
            if phase == _DATA:
                take = min(left, end - pos)
                pieces.append(pending[pos : pos + take])
                pos += take
                left -= take
                if left:
                    break
                phase = _CRLF
            elif phase == _CRLF:
                if end - pos < 2:
                    break
                if pending[pos : pos + 2] != b"\r\n":
                    raise BackendCut(label)
                pos += 2
                phase = _SIZE
            else:
                eol = pending.find(b"\r\n", pos, pos + MAX_CHUNK_LINE)
                if eol < 0:
                    if end - pos >= MAX_CHUNK_LINE:
                        raise BackendCut(label)
                    break
                line = pending[pos:eol]
                pos = eol + 2
                if phase == _TRAILER:
                    if not line:  # the body's end
                        if pos != end:  # bytes nobody asked for (no request was pipelined)
                            response.will_close = True  # so the connection is not reused
                        response.chunk_left = None
                        response.length = 0
                        if pieces:
                            yield b"".join(pieces)
                        return
                    continue
                try:
                    left = int(line.split(b";", 1)[0], 16)
                except ValueError:
                    raise BackendCut(label) from None
                if left < 0:
                    raise BackendCut(label)
                phase = _DATA if left else _TRAILER
        pending = pending[pos:]
        if pieces:
            yield pieces[0] if len(pieces) == 1 else b"".join(pieces)

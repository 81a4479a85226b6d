"""Streaming, pooled proxying of OpenAI ``/v1`` requests to the managed llama-server.

Responses are relayed chunk by chunk as they arrive (server-sent events included), never
buffered whole. Closing a response early (the client went away) closes the upstream
connection, which makes llama-server cancel the generation. While waiting for the first
response byte (a whole non-streamed generation, or a long prompt before the first streamed
token) the client is watched through :data:`werk_host.backend.client_disconnected`, so that a
client that leaves before any byte was relayed cancels the upstream request too.
"""

from __future__ import annotations

import http.client
import json
import logging
import select
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from werk_host.backend import InferenceResponse, client_disconnected
from werk_host.errors import ErrorCode, WerkError

log = logging.getLogger(__name__)

READ_CHUNK = 16 * 1024
#: ``content-length`` too: a non-streamed answer then leaves waitress unchunked, which saves the
#: client a round of chunk framing (about 0.4 ms per request measured on a loopback). Event
#: streams keep llama-server's "do not buffer me" hints for proxies in front of Werk.
PASSED_HEADERS = ("content-type", "content-length", "cache-control", "x-accel-buffering")
WATCH_INTERVAL_S = 0.1
#: llama-server closes keep-alive connections idle for 5 s (``Keep-Alive: timeout=5``); the pool
#: drops them a little earlier instead of finding out by sending a request into a closed socket.
IDLE_REUSE_S = 4.0
#: Failures that show a reused keep-alive connection had been closed by the server before it
#: read our request, so sending it again on a fresh connection cannot run it twice.
STALE = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)


class ConnectionPool:
    """Keep-alive connections to one ``host:port``; a connection is reused only when its
    previous response was read to the end, and only while the server still keeps it open.

    With ``api_key``, every request sent through the pool (:func:`post_json`, :func:`forward`)
    carries ``Authorization: Bearer <key>``; the key is never part of a repr or an error."""

    def __init__(
        self, host: str, port: int, *, size: int = 16, timeout: float = 600.0, api_key: str | None = None
    ) -> None:
        self.host, self.port, self.size, self.timeout = host, port, size, timeout
        self.auth_headers: dict[str, str] = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._idle: list[tuple[float, http.client.HTTPConnection]] = []
        self._lock = threading.Lock()

    def acquire(self) -> tuple[http.client.HTTPConnection, bool]:
        """A connection and whether it is a reused one."""
        stale: list[http.client.HTTPConnection] = []
        conn = None
        with self._lock:
            now = time.monotonic()
            while self._idle:
                since, candidate = self._idle.pop()
                if now - since < IDLE_REUSE_S:
                    conn = candidate
                    break
                stale.append(candidate)
        for old in stale:
            old.close()
        if conn is not None:
            return conn, True
        return http.client.HTTPConnection(self.host, self.port, timeout=self.timeout), False

    def release(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if len(self._idle) < self.size:
                self._idle.append((time.monotonic(), conn))
                return
        conn.close()

    def idle(self) -> int:
        with self._lock:
            return len(self._idle)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for _, conn in idle:
            conn.close()

    def __repr__(self) -> str:
        return f"<ConnectionPool {self.host}:{self.port} idle={self.idle()}>"


class ClientGone(WerkError):
    """The client disconnected before the upstream answered; the upstream request was closed."""

    def __init__(self) -> None:
        super().__init__(ErrorCode.UNAVAILABLE, "the client disconnected; the request was cancelled", retryable=True)


def _await_answer(conn: http.client.HTTPConnection, gone: Callable[[], bool]) -> None:
    """Block until the upstream socket is readable; raise :class:`ClientGone` if the client
    leaves first. (Nothing is buffered yet: the response object does not exist.)"""
    sock = conn.sock
    if sock is None:
        return
    poller = select.poll()
    poller.register(sock, select.POLLIN | select.POLLPRI | select.POLLERR | select.POLLHUP)
    while not poller.poll(WATCH_INTERVAL_S * 1000):
        if gone():
            raise ClientGone()


def post_json(pool: ConnectionPool, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST ``body`` over a pooled keep-alive connection; the (small) JSON object answered.

    A 4xx refusal of the request itself (not of our key, not a timeout or rate limit) is
    ``invalid_request``; any other failure, another non-200 status included, is ``unavailable``."""
    payload = json.dumps(body).encode()
    while True:
        conn, reused = pool.acquire()
        try:
            conn.request("POST", path, body=payload, headers={"Content-Type": "application/json", **pool.auth_headers})
            response = conn.getresponse()
            raw = response.read()
            break
        except (ConnectionError, http.client.HTTPException, OSError) as err:
            conn.close()
            if reused and isinstance(err, STALE):
                continue
            raise WerkError(ErrorCode.UNAVAILABLE, "llama-server is not answering", retryable=True) from err
    if response.will_close:
        conn.close()
    else:
        pool.release(conn)
    if 400 <= response.status < 500 and response.status not in (401, 403, 408, 429):
        # llama-server refused the request itself (bad messages, unsupported content parts):
        # the client's error, not a failing backend; its own message stays in our log only.
        log.info("llama-server %s refused a request (%s): %.300s", path, response.status, raw)
        raise WerkError(ErrorCode.INVALID_REQUEST, "the backend refused this request as invalid")
    try:
        data = json.loads(raw) if response.status == 200 else None
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise WerkError(ErrorCode.UNAVAILABLE, f"llama-server {path} failed ({response.status})", retryable=True)
    return data


def forward(pool: ConnectionPool, path: str, body: dict[str, Any]) -> InferenceResponse:
    """POST ``body`` to ``path`` upstream and relay the response as it streams."""
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
            conn.request("POST", path, body=payload, headers=headers)
            if gone is not None:
                _await_answer(conn, gone)
            response = conn.getresponse()
            break
        except ClientGone:
            conn.close()  # llama-server sees its client go and cancels the task
            raise
        except (ConnectionError, http.client.HTTPException, OSError) as err:
            conn.close()
            if reused and isinstance(err, STALE):
                continue  # the server had closed this keep-alive connection: never ran the request
            raise WerkError(ErrorCode.UNAVAILABLE, "llama-server is not answering", retryable=True) from err
    state = {"done": False, "closed": False}

    def body_iter() -> Iterator[bytes]:
        while True:
            chunk = response.read1(READ_CHUNK)
            if not chunk:
                state["done"] = True
                return
            yield chunk

    def close() -> None:
        if state["closed"]:
            return
        state["closed"] = True
        if state["done"] and not response.will_close:
            # read1() does not close a fully read Content-Length response by itself, and
            # http.client refuses the next request on a connection whose response is open.
            response.close()
            pool.release(conn)
        else:
            conn.close()  # early close: the upstream sees the disconnect and stops generating

    relayed = {k: v for k, v in response.getheaders() if k.lower() in PASSED_HEADERS}
    return InferenceResponse(status=response.status, headers=relayed, body=body_iter(), close=close)

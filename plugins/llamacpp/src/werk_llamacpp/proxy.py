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
import select
import threading
from collections.abc import Callable, Iterator
from typing import Any

from werk_host.backend import InferenceResponse, client_disconnected
from werk_host.errors import ErrorCode, WerkError

READ_CHUNK = 16 * 1024
PASSED_HEADERS = ("content-type",)
WATCH_INTERVAL_S = 0.1


class ConnectionPool:
    """Keep-alive connections to one ``host:port``; a connection is reused only when its
    previous response was read to the end."""

    def __init__(self, host: str, port: int, *, size: int = 16, timeout: float = 600.0) -> None:
        self.host, self.port, self.size, self.timeout = host, port, size, timeout
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def acquire(self) -> http.client.HTTPConnection:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)

    def release(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if len(self._idle) < self.size:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


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


def forward(pool: ConnectionPool, path: str, body: dict[str, Any]) -> InferenceResponse:
    """POST ``body`` to ``path`` upstream and relay the response as it streams."""
    payload = json.dumps(body).encode()
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    gone = client_disconnected.get()
    for attempt in (1, 2):
        conn = pool.acquire()
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
            # A pooled keep-alive connection may have been closed by the server: retry once fresh.
            if attempt == 2:
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
            pool.release(conn)
        else:
            conn.close()  # early close: the upstream sees the disconnect and stops generating

    relayed = {k: v for k, v in response.getheaders() if k.lower() in PASSED_HEADERS}
    return InferenceResponse(status=response.status, headers=relayed, body=body_iter(), close=close)

"""The waitress server ``werk serve`` runs: a read deadline per request, headroom at the
connection limit, and parse errors in each API's error shape (docs/operations.md, "Connections").

waitress's ``channel_timeout`` only closes a connection that has been *silent* that long, so a
client sending one byte every few seconds could hold a connection (and, past the connection
limit, the server) forever. :class:`Server` and :class:`Channel` add, without patching waitress:

* **Request read deadline.** A request must be received whole (headers and body) within
  ``request_read_timeout`` seconds of its first byte, however steadily its bytes trickle in. The
  check runs with waitress's sweep, every ``cleanup_interval`` seconds and up to one poll
  timeout (1 s) late, so a late request is closed at most ``request_read_timeout +
  cleanup_interval + 1`` seconds after its first byte, answered ``408`` in its API's error shape
  (best effort: the connection is closed whatever the send does). The clock only runs while no
  request of that connection is in service: a running request or stream is never affected, and
  the clock of a request pipelined behind it restarts at each sweep until it is done.
* **Headroom.** When the open connections reach ``connection_limit``, instead of no longer
  accepting, the server closes a tenth of the limit (at least one) of the connections that hold
  nothing in service and have no answer pending: first those still receiving a request, slowest
  first (fewest bytes per second since its first byte), then idle ones, longest idle first. New
  connections are thus accepted while slow or idle ones hold every slot. Only when every
  connection has a request in service does the server stop accepting (waitress's behaviour), and
  new connections wait in the listen backlog.
* **No write spin.** waitress flushes a response's bytes in the worker thread that writes them
  (``send_bytes`` 1) and wakes the main loop only when bytes are left over (the client reads
  slowly). While a worker is inside such a write, :meth:`Channel.writable` says no unless the
  worker waits for the main loop to drain its buffer (the outbuf lock is then free), and a write
  that leaves bytes behind wakes the main loop once it is done: otherwise
  the main loop, run whenever the worker releases the GIL for its ``send``, would find the
  channel writable, fail to take the lock and poll again at once, once per streamed event
  (docs/operations.md, "Where relay time goes").
* **Parse errors.** A request waitress's parser refuses (a control byte in a header, bad
  framing) is answered in the error shape of the API its request line names
  (werk_host/http/framing.py) instead of waitress's plain text.

:func:`create_server` binds and listens before anything else starts (``werk serve`` calls it
before any backend or model, docs/operations.md, "Start-up"): an address that cannot be used
(taken, not this machine's, a privileged port, a host name that does not resolve) raises
:class:`AddressError`, whose ``message`` names the address and whose ``fix`` says how to choose
another, with no socket or worker thread left behind.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import heapq
import logging
import resource
import socket
import time
from typing import Any

from waitress.adjustments import Adjustments  # type: ignore[import-untyped]
from waitress.channel import HTTPChannel  # type: ignore[import-untyped]
from waitress.server import MultiSocketServer, TcpWSGIServer  # type: ignore[import-untyped]
from waitress.task import ErrorTask, ThreadedTaskDispatcher, WSGITask  # type: ignore[import-untyped]

from werk_host.pump import Pump
from werk_host.seam import PUMP_ENVIRON

log = logging.getLogger("werk_host.server")

#: The share of ``connection_limit`` closed at once when the limit is reached.
HEADROOM_SHARE = 10
#: Seconds before the server tries again to shed when every connection was in service.
SHED_RETRY = 1.0
#: Reads that drain a connection closed past the deadline (a bound: the client may keep sending).
DRAIN_READS = 16
#: Seconds between two warnings that connections were shed or closed past the deadline.
WARN_INTERVAL = 60.0


def _first_line(parser: Any) -> bytes | None:
    """The request line of a request being parsed, once the client has sent it whole."""
    partial: bytes = parser.header_plus
    if partial:
        line, crlf, _ = partial.lstrip().partition(b"\r\n")
        if crlf:
            return line
    found: bytes | None = getattr(parser, "first_line", None)
    return found


class ShapedErrorTask(ErrorTask):  # type: ignore[misc]
    """waitress's answer to a request its parser refused, in the API's error shape."""

    def execute(self) -> None:
        from werk_host.http import framing  # with the app, built before anything is served

        error = self.request.error
        status, headers, body = framing.parse_error(_first_line(self.request), error.code, str(error.body))
        self.status = status
        self.response_headers.extend(headers)
        self.set_close_on_finish()
        self.content_length = len(body)
        self.write(body)


class PumpedTask(WSGITask):  # type: ignore[misc]
    """A request whose environ offers the server's pump (werk_host/pump.py) to the app."""

    def get_environment(self) -> dict[str, Any]:
        environ: dict[str, Any] = super().get_environment()
        if PUMP_ENVIRON not in environ:
            pump: Pump = self.channel.server.pump
            environ[PUMP_ENVIRON] = functools.partial(pump.run, self)
        return environ


class Channel(HTTPChannel):  # type: ignore[misc]
    """A connection that knows since when its current request has been arriving.

    ``reading_since`` (monotonic seconds) is set by the first byte of a request and cleared
    once the request is received whole; ``read_bytes`` counts that request's bytes so far."""

    error_task_class = ShapedErrorTask
    task_class = PumpedTask
    reading_since: float | None = None
    read_bytes = 0
    #: a worker thread is inside :meth:`write_soon` (module docstring, "No write spin")
    writing = False

    def write_soon(self, data: bytes) -> int:
        self.writing = True
        try:
            written: int = super().write_soon(data)
        finally:
            self.writing = False
        if self.total_outbufs_len:  # left for the main loop, which may have looked while we wrote
            self.server.pull_trigger()
        return written

    def writable(self) -> bool:
        if self.writing and not (self.will_close or self.close_when_flushed):
            # the writer flushes, and pulls the trigger for what it leaves; it only needs the
            # main loop while it waits under the high watermark, with the lock released
            if not self.outbuf_lock.acquire(blocking=False):
                return False
            self.outbuf_lock.release()
        return bool(self.total_outbufs_len or self.will_close or self.close_when_flushed)

    def received(self, data: bytes) -> bool:
        before = self.request
        result: bool = super().received(data)
        if self.request is None:
            self.reading_since = None
            self.read_bytes = 0
        elif self.request is not before:
            self.reading_since = time.monotonic()
            self.read_bytes = len(data)
        else:
            self.read_bytes += len(data)
        return result

    def holds_nothing(self) -> bool:
        """No request in service, no answer pending, not closing: closing it loses nothing."""
        return not (self.requests or self.total_outbufs_len or self.will_close or self.close_when_flushed)

    def overdue(self, now: float, deadline: float) -> bool:
        """Whether its request has been arriving for ``deadline`` seconds or more. While a
        request of this connection is in service, the clock of the next one restarts."""
        if self.reading_since is None:
            return False
        if self.requests:
            self.reading_since = now
            return False
        return self.holds_nothing() and now - self.reading_since >= deadline

    def expire(self, deadline: float) -> None:
        """Answer 408 (best effort: one non-blocking send) and close. Bytes already received are
        read first, so that the close is a FIN after the answer rather than a reset."""
        from werk_host.http import framing  # with the app, built before anything is served

        answer = framing.read_timeout(_first_line(self.request) if self.request is not None else None, deadline)
        with contextlib.suppress(OSError):
            for _ in range(DRAIN_READS):
                if not self.socket.recv(self.adj.recv_bytes):
                    break
        with contextlib.suppress(OSError):
            self.socket.send(answer)
        self.handle_close()

    def shed_order(self, now: float) -> tuple[int, float]:
        if self.reading_since is not None:
            return (0, self.read_bytes / max(now - self.reading_since, 1e-3))
        return (1, float(self.last_activity))


class Server(TcpWSGIServer):  # type: ignore[misc]
    """A TCP waitress server with :class:`Channel` connections, the request read deadline and
    the headroom of the module docstring."""

    channel_class = Channel

    def __init__(self, *args: Any, request_read_timeout: float, pump: Pump, **kwargs: Any) -> None:
        self.request_read_timeout = request_read_timeout
        self.pump = pump
        self._warned = -WARN_INTERVAL
        self._next_shed = 0.0
        self._shed_count = 0
        self._expired_count = 0
        super().__init__(*args, **kwargs)

    def close(self) -> None:
        self.pump.close()  # its streams go back to their threads
        super().close()

    def readable(self) -> bool:
        if self.accepting and len(self._map) >= self.adj.connection_limit:
            now = time.monotonic()
            if now >= self._next_shed:
                self.shed(now)
        result: bool = super().readable()
        return result

    def shed(self, now: float) -> None:
        """Close the connections that make room (module docstring, "Headroom"). When none can
        be closed (all in service), the next try waits :data:`SHED_RETRY` seconds, so that a
        full server does not scan its connections on every loop iteration."""
        excess = len(self._map) - self.adj.connection_limit
        count = excess + max(1, self.adj.connection_limit // HEADROOM_SHARE)
        candidates = [c for c in self.active_channels.values() if isinstance(c, Channel) and c.holds_nothing()]
        if not candidates:
            self._next_shed = now + SHED_RETRY
            return
        for channel in heapq.nsmallest(count, candidates, key=lambda c: c.shed_order(now)):
            channel.handle_close()
            self._shed_count += 1
        self._warn(now)

    def maintenance(self, now: float) -> None:
        super().maintenance(now)
        clock = time.monotonic()
        deadline = self.request_read_timeout
        for channel in list(self.active_channels.values()):
            if isinstance(channel, Channel) and channel.overdue(clock, deadline):
                channel.expire(deadline)
                self._expired_count += 1
        self._warn(clock)

    def _warn(self, now: float) -> None:
        if not (self._shed_count or self._expired_count) or now - self._warned < WARN_INTERVAL:
            return
        log.warning(
            "closed %d connections at the connection limit and %d past the request read deadline "
            "(docs/operations.md, Connections)",
            self._shed_count,
            self._expired_count,
        )
        self._warned = now
        self._shed_count = self._expired_count = 0


#: Ollama's default port, which is also ``werk serve``'s (docs/operations.md, "Start-up").
OLLAMA_PORT = 11434


class AddressError(Exception):
    """The listen address cannot be used: ``message`` names it and says why, ``fix`` says how
    to choose another (``--host``/``--port``, ``WERK_HOST``/``WERK_PORT``)."""

    def __init__(self, message: str, fix: str) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix


def address_text(host: str, port: int) -> str:
    """``HOST:PORT``, an IPv6 literal in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def address_error(host: str, port: int, err: OSError | None) -> AddressError:
    """What to say when ``host:port`` cannot be bound (``err`` ``None``: it does not resolve)."""
    where = address_text(host, port)
    other_port = "choose another port with --port N or WERK_PORT=N"
    other_host = "choose another host with --host HOST or WERK_HOST=HOST, e.g. 127.0.0.1"
    if err is None:
        return AddressError(f"cannot listen on {where}: {host} is not a host name or address here", other_host)
    if err.errno == errno.EADDRINUSE:
        taken = f"another program listens there; {OLLAMA_PORT} is Ollama's default port" if port == OLLAMA_PORT else ""
        return AddressError(f"{where} is already in use", f"{taken}; {other_port}" if taken else other_port)
    if err.errno == errno.EACCES:
        return AddressError(
            f"cannot listen on {where}: permission denied", f"ports below 1024 need privileges; {other_port}"
        )
    if err.errno == errno.EADDRNOTAVAIL:
        return AddressError(f"cannot listen on {where}: that address is not one of this machine's", other_host)
    reason = err.strerror or type(err).__name__
    return AddressError(
        f"cannot listen on {where}: {reason}", "choose another address with --host/--port or WERK_HOST/WERK_PORT"
    )


def create_server(app: Any, *, request_read_timeout: float, **adjustments: Any) -> Any:
    """waitress's ``create_server`` with :class:`Server` for each TCP listen address: the
    server itself for one address, a ``MultiSocketServer`` running them all for several.

    Every address is bound and listening when it returns; one that cannot be raises
    :class:`AddressError` (module docstring) and closes those already bound. The worker threads
    start only once every address is bound."""
    host, port = str(adjustments.get("host", "")), int(adjustments.get("port", 0))
    try:
        adj = Adjustments(**adjustments)
    except ValueError as err:
        if "host/port" in str(err):  # waitress: the host does not resolve
            raise address_error(host, port, None) from None
        raise
    dispatcher = ThreadedTaskDispatcher()
    pump = Pump()  # one event loop for every address's pumped streams
    socket_map: dict[int, Any] = {}
    servers: list[Server] = []
    try:
        for sockinfo in adj.listen:
            if sockinfo[0] in (socket.AF_INET, socket.AF_INET6):
                servers.append(
                    Server(
                        app,
                        socket_map,
                        dispatcher=dispatcher,
                        adj=adj,
                        sockinfo=sockinfo,
                        request_read_timeout=request_read_timeout,
                        pump=pump,
                    )
                )
    except OSError as err:
        for bound in servers:
            bound.close()
        for leftover in list(socket_map.values()):  # the socket and trigger of the one that failed
            with contextlib.suppress(OSError):
                leftover.close()
        raise address_error(host, port, err) from None
    dispatcher.set_thread_count(adj.threads)
    if len(servers) == 1:
        return servers[0]
    listening = [(s.effective_host, s.effective_port) for s in servers]
    return MultiSocketServer(socket_map, adj, listening, dispatcher, servers[0].log_info)


def raise_descriptor_limit(needed: int) -> None:
    """Raise this process's soft open-file limit towards ``needed`` (at most the hard limit):
    each connection is one descriptor. Warns when the hard limit is lower."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    if target < needed:
        log.warning("open-file limit %d is below the %d descriptors the connection limit needs", target, needed)

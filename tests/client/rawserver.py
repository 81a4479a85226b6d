"""Small misbehaving HTTP servers on 127.0.0.1 ephemeral ports, written on raw sockets.

Each accepted connection reads one request (head and Content-Length body), records it,
then plays the next scripted response: raw bytes, or a callable that writes to the socket
itself (to drip, stall or send bytes late). The server never parses or fixes what it sends.
"""

from __future__ import annotations

import json
import socket
import socketserver
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

Script = bytes | Callable[[socket.socket, threading.Event], None]


@dataclass
class Recorded:
    method: str
    target: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class RawServer:
    url: str
    requests: list[Recorded] = field(default_factory=list)
    connections: int = 0


def _read_request(sock: socket.socket) -> Recorded | None:
    sock.settimeout(5)
    data = b""
    while b"\r\n\r\n" not in data:
        try:
            chunk = sock.recv(65536)
        except OSError:
            return None
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, target, _ = lines[0].split(" ", 2)
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return Recorded(method, target, headers, body)


@contextmanager
def raw_server(*scripts: Script, linger: float = 0.0) -> Iterator[RawServer]:
    """Serve ``scripts`` in order (the last one repeats); yields the server with its URL.

    ``linger`` keeps each connection open that many seconds after the script ran (a server
    that ignores ``Connection: close``).
    """
    stop = threading.Event()
    state: dict[str, RawServer] = {}

    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            server = state["server"]
            index = min(server.connections, len(scripts) - 1)
            server.connections += 1
            recorded = _read_request(self.request)
            if recorded is None:
                return
            server.requests.append(recorded)
            script = scripts[index]
            try:
                if callable(script):
                    script(self.request, stop)
                else:
                    self.request.sendall(script)
                if linger:
                    stop.wait(linger)
            except OSError:
                pass

    tcp = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
    tcp.daemon_threads = True
    port = tcp.server_address[1]
    state["server"] = RawServer(url=f"http://127.0.0.1:{port}")
    thread = threading.Thread(target=tcp.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield state["server"]
    finally:
        stop.set()
        tcp.shutdown()
        tcp.server_close()
        thread.join(timeout=5)


# -- response builders -------------------------------------------------------------------
def envelope(data: Any = None, *, major: int = 1, minor: int = 0, request_id: str = "req_raw", **extra: Any) -> bytes:
    body: dict[str, Any] = {"protocol": {"major": major, "minor": minor}, "request_id": request_id}
    if "error" not in extra:
        body["data"] = data
    body.update(extra)
    return json.dumps(body).encode()


def error_envelope(code: str, message: str = "failed", *, retryable: bool = False, **kw: Any) -> bytes:
    return envelope(error={"code": code, "message": message, "retryable": retryable}, **kw)


def http(
    body: bytes,
    *,
    status: str = "200 OK",
    version_header: str | None = "1.0",
    content_type: str | None = "application/json",
    content_length: int | None | bool = True,
    extra_headers: tuple[tuple[str, str], ...] = (),
    http_version: str = "HTTP/1.1",
) -> bytes:
    """A response head plus ``body``; ``content_length`` True = the real length, int = a chosen one."""
    lines = [f"{http_version} {status}"]
    if content_type is not None:
        lines.append(f"Content-Type: {content_type}")
    if version_header is not None:
        lines.append(f"X-Werk-Protocol-Version: {version_header}")
    if content_length is True:
        lines.append(f"Content-Length: {len(body)}")
    elif isinstance(content_length, int) and content_length is not False:
        lines.append(f"Content-Length: {content_length}")
    lines += [f"{k}: {v}" for k, v in extra_headers]
    lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def chunked(*parts: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts if p) + b"0\r\n\r\n"


INFO = {
    "service": "werk-host",
    "service_version": "0.0.0",
    "protocol": {"major": 1, "minor": 0},
    "active_backend": None,
    "limits": {
        "max_page_size": 100,
        "max_state_ids_per_operation": 100,
        "max_expert_ids_per_operation": 256,
        "max_request_bytes": 1048576,
        "max_handoff_bytes": 4096,
        "max_ttl_seconds": 2592000,
    },
}

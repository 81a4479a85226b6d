"""A strict, bounded HTTP/1.1 exchange on the standard library's ``socket`` module.

One request per connection (``Connection: close``), an overall deadline per request, no
redirects, and a response parser that refuses anything it cannot frame exactly: a
Content-Length that is short or followed by extra bytes, broken or oversized chunked
framing, obsolete line folding, conflicting framing headers, or a body over the limit.
``http.client`` is deliberately not used: it tolerates several of those conditions.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import time
from dataclasses import dataclass

from werk_host.client.errors import (
    ClientTimeoutError,
    FramingError,
    InvalidBaseUrlError,
    ProtocolViolationError,
    RedirectError,
    ResponseTooLargeError,
    TransportError,
)

MAX_URL_CHARS = 2048
MAX_HEAD_BYTES = 64 * 1024
MAX_HEADERS = 128
MAX_CHUNK_LINE_BYTES = 1024
MAX_INTERIM_RESPONSES = 4
#: How long to wait after a complete body for bytes the server should not have sent.
TRAILING_GRACE_SECONDS = 0.5

_LABEL = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")
_TOKEN = re.compile(rb"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_STATUS_LINE = re.compile(rb"^HTTP/1\.([01]) ([1-9][0-9]{2})(?: ([^\r\n]*))?$")
_CHUNK_SIZE = re.compile(rb"^([0-9A-Fa-f]{1,16})[ \t]*(?:;[^\r\n]*)?$")
_DIGITS = re.compile(r"^[0-9]{1,19}$")


@dataclass(frozen=True)
class Endpoint:
    """A validated ``http://HOST:PORT`` base URL."""

    host: str
    port: int

    @property
    def authority(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.authority}"


def _bad(reason: str) -> InvalidBaseUrlError:
    return InvalidBaseUrlError(f"invalid server URL: {reason}; expected http://HOST:PORT")


def parse_base_url(url: object) -> Endpoint:
    """Accept only ``http://HOST:PORT`` (a lone trailing ``/`` allowed); raise otherwise.

    Rejected: other schemes, a missing or invalid port, a path, a query or fragment,
    user information, IPv6 zone identifiers, whitespace, control or non-ASCII characters.
    """
    if not isinstance(url, str):
        raise _bad("not a string")
    if not url or len(url) > MAX_URL_CHARS:
        raise _bad("empty or too long")
    if any(ord(c) <= 0x20 or ord(c) >= 0x7F or c == "\\" for c in url):
        raise _bad("whitespace, control, backslash or non-ASCII characters")
    if url[:7].lower() != "http://":
        raise _bad("only http:// is accepted (Werk does not terminate TLS)")
    rest = url[7:]
    if "?" in rest or "#" in rest:
        raise _bad("a query or fragment is not allowed")
    if "@" in rest:
        raise _bad("user information is not allowed")
    if rest.endswith("/"):
        rest = rest[:-1]
    if "/" in rest:
        raise _bad("a path is not allowed")
    if rest.startswith("["):
        close = rest.find("]")
        if close < 0:
            raise _bad("unterminated IPv6 literal")
        host, after = rest[1:close], rest[close + 1 :]
        if not after.startswith(":"):
            raise _bad("an explicit port is required")
        port_text = after[1:]
        if "%" in host:
            raise _bad("IPv6 zone identifiers are not accepted")
        try:
            host = str(ipaddress.IPv6Address(host))
        except ValueError:
            raise _bad("invalid IPv6 literal") from None
    else:
        host, sep, port_text = rest.rpartition(":")
        if not sep:
            raise _bad("an explicit port is required")
        if not host:
            raise _bad("the host is empty")
        if ":" in host:
            raise _bad("an IPv6 host must be bracketed")
        host = host.lower()
        if all(c.isdigit() or c == "." for c in host):
            try:
                host = str(ipaddress.IPv4Address(host))
            except ValueError:
                raise _bad("invalid IPv4 address") from None
        elif len(host) > 253 or not all(_LABEL.match(label) for label in host.split(".")):
            raise _bad("invalid host name")
    if not _DIGITS.match(port_text) or len(port_text) > 5:
        raise _bad("the port must be a decimal number")
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise _bad("the port must be 1..65535")
    return Endpoint(host=host, port=port)


@dataclass(frozen=True)
class RawResponse:
    status: int
    reason: str
    headers: tuple[tuple[str, str], ...]
    body: bytes

    def values(self, name: str) -> list[str]:
        key = name.lower()
        return [v for k, v in self.headers if k == key]

    def single(self, name: str) -> str | None:
        """The one value of header ``name``, ``None`` if absent; a repeated header is a violation."""
        found = self.values(name)
        if len(found) > 1:
            raise ProtocolViolationError(f"response header {name} appears more than once", status=self.status)
        return found[0] if found else None


class _Reader:
    """Buffered reads from a socket under one monotonic deadline."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.deadline = deadline
        self.buf = bytearray()

    def _remaining(self) -> float:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise ClientTimeoutError("the request timed out while reading the response")
        return remaining

    def _fill(self) -> bool:
        self.sock.settimeout(self._remaining())
        try:
            chunk = self.sock.recv(65536)
        except TimeoutError:
            raise ClientTimeoutError("the request timed out while reading the response") from None
        except OSError as err:
            raise TransportError(f"reading the response failed: {err.strerror or type(err).__name__}") from None
        if not chunk:
            return False
        self.buf += chunk
        return True

    def line(self, limit: int, what: str) -> bytes:
        start = 0
        while True:
            idx = self.buf.find(b"\r\n", start)
            if idx >= 0:
                if idx > limit:
                    raise FramingError(f"{what} exceeds {limit} bytes")
                out = bytes(self.buf[:idx])
                del self.buf[: idx + 2]
                if b"\n" in out or b"\r" in out:
                    raise FramingError(f"bare CR or LF in {what}")
                return out
            if len(self.buf) > limit:
                raise FramingError(f"{what} exceeds {limit} bytes")
            start = max(0, len(self.buf) - 1)
            if not self._fill():
                raise FramingError(f"the connection closed inside the {what}")

    def exact(self, n: int, what: str) -> bytes:
        while len(self.buf) < n:
            if not self._fill():
                raise FramingError(f"the connection closed after {len(self.buf)} of {n} {what} bytes")
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def ensure_nothing_more(self, status: int) -> None:
        """After a complete message, any further byte means the framing lied."""
        if self.buf:
            raise FramingError("the server sent bytes beyond the declared response body", status=status)
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            return
        self.sock.settimeout(min(remaining, TRAILING_GRACE_SECONDS))
        try:
            extra = self.sock.recv(1)
        except OSError:  # timeout or reset: nothing more arrived, the message is complete
            return
        if extra:
            raise FramingError("the server sent bytes beyond the declared response body", status=status)


def _read_head(reader: _Reader) -> tuple[int, int, str, list[tuple[str, str]]]:
    used = 0
    status_line = reader.line(MAX_HEAD_BYTES, "status line")
    used += len(status_line) + 2
    match = _STATUS_LINE.match(status_line)
    if match is None:
        raise FramingError("the response does not start with an HTTP/1.x status line")
    minor, status = int(match.group(1)), int(match.group(2))
    reason = (match.group(3) or b"").decode("latin-1")
    headers: list[tuple[str, str]] = []
    while True:
        line = reader.line(MAX_HEAD_BYTES, "response header section")
        used += len(line) + 2
        if used > MAX_HEAD_BYTES:
            raise FramingError("the response header section exceeds 64 KiB", status=status)
        if not line:
            break
        if line[:1] in (b" ", b"\t"):
            raise FramingError("obsolete header line folding is not accepted", status=status)
        name, colon, value = line.partition(b":")
        if not colon or not _TOKEN.match(name):
            raise FramingError("malformed response header line", status=status)
        text = value.strip(b" \t")
        if any(b < 0x20 and b != 0x09 or b == 0x7F for b in text):
            raise FramingError("control characters in a response header", status=status)
        headers.append((name.decode("ascii").lower(), text.decode("latin-1")))
        if len(headers) > MAX_HEADERS:
            raise FramingError(f"more than {MAX_HEADERS} response headers", status=status)
    return minor, status, reason, headers


def _read_chunked(reader: _Reader, limit: int, status: int) -> bytes:
    parts: list[bytes] = []
    total = 0
    while True:
        size_line = reader.line(MAX_CHUNK_LINE_BYTES, "chunk size line")
        match = _CHUNK_SIZE.match(size_line)
        if match is None:
            raise FramingError("invalid chunk size line", status=status)
        size = int(match.group(1), 16)
        if size == 0:
            break
        total += size
        if total > limit:
            raise ResponseTooLargeError(f"the chunked response body exceeds {limit} bytes", status=status)
        parts.append(reader.exact(size, "chunk"))
        if reader.exact(2, "chunk terminator") != b"\r\n":
            raise FramingError("chunk data is not followed by CRLF", status=status)
    trailer_bytes = 0
    while True:
        line = reader.line(MAX_HEAD_BYTES, "chunked trailer section")
        trailer_bytes += len(line) + 2
        if trailer_bytes > MAX_HEAD_BYTES:
            raise FramingError("the chunked trailer section exceeds 64 KiB", status=status)
        if not line:
            break
        name, colon, _ = line.partition(b":")
        if not colon or not _TOKEN.match(name) or line[:1] in (b" ", b"\t"):
            raise FramingError("malformed chunked trailer line", status=status)
    return b"".join(parts)


def _read_body(reader: _Reader, minor: int, status: int, headers: list[tuple[str, str]], limit: int) -> bytes:
    te = [v for k, v in headers if k == "transfer-encoding"]
    cl = [v for k, v in headers if k == "content-length"]
    if te:
        if cl:
            raise FramingError("both Transfer-Encoding and Content-Length were sent", status=status)
        if minor == 0:
            raise FramingError("Transfer-Encoding in an HTTP/1.0 response", status=status)
        codings = [c.strip().lower() for v in te for c in v.split(",")]
        if codings != ["chunked"]:
            raise FramingError("unsupported Transfer-Encoding (only chunked is accepted)", status=status)
        return _read_chunked(reader, limit, status)
    if cl:
        values = {c.strip() for v in cl for c in v.split(",")}
        if len(values) != 1:
            raise FramingError("conflicting Content-Length values", status=status)
        text = values.pop()
        if not _DIGITS.match(text):
            raise FramingError("invalid Content-Length", status=status)
        length = int(text)
        if length > limit:
            raise ResponseTooLargeError(f"the response body ({length} bytes) exceeds {limit} bytes", status=status)
        return reader.exact(length, "body")
    if status in (204, 304):
        return b""
    raise FramingError("the response has neither Content-Length nor chunked framing", status=status)


def exchange(
    endpoint: Endpoint,
    method: str,
    target: str,
    headers: list[tuple[str, str]],
    body: bytes | None,
    *,
    timeout: float,
    max_response_bytes: int,
) -> RawResponse:
    """Send one request and read one strictly framed response within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    lines = [f"{method} {target} HTTP/1.1", f"Host: {endpoint.authority}"]
    lines += [f"{name}: {value}" for name, value in headers]
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    lines.append("Connection: close")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    try:
        sock = socket.create_connection((endpoint.host, endpoint.port), timeout=timeout)
    except TimeoutError:
        raise ClientTimeoutError(f"connecting to {endpoint.url} timed out") from None
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise TransportError(f"cannot connect to {endpoint.url}: {reason}") from None
    with sock:
        reader = _Reader(sock, deadline)
        try:
            sock.settimeout(reader._remaining())
            sock.sendall(head + (body or b""))
        except TimeoutError:
            raise ClientTimeoutError("the request timed out while sending") from None
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may have answered early (e.g. 413); try to read that answer
        except OSError as err:
            raise TransportError(f"sending the request failed: {err.strerror or type(err).__name__}") from None
        for _ in range(MAX_INTERIM_RESPONSES + 1):
            minor, status, reason, response_headers = _read_head(reader)
            if status == 101:
                raise ProtocolViolationError("unexpected protocol switch (101)", status=status)
            if status >= 200:
                break
        else:
            raise ProtocolViolationError("too many interim (1xx) responses")
        if 300 <= status < 400:
            raise RedirectError(
                f"the server answered with a redirect ({status}); redirects are never followed", status=status
            )
        payload = _read_body(reader, minor, status, response_headers, max_response_bytes)
        reader.ensure_nothing_more(status)
    return RawResponse(status=status, reason=reason, headers=tuple(response_headers), body=payload)

"""Answers to requests the HTTP server refuses before the app runs, in each API's error shape.

The server (werk_host/serving.py) refuses a request whose framing it cannot parse (a control
byte in a header, a malformed start line or chunk, oversized headers, an unsupported transfer
coding) and one that is not received whole within the request read deadline (408;
docs/operations.md, "Connections"). Those answers are rendered by the app's own error mapper
(werk_host/http/app.py) for the path the request line names, so that ``/v1/messages`` answers
in Anthropic's shape, ``/api`` in Ollama's, ``/v1`` in OpenAI's and everything else in the Werk
envelope, exactly as the app's own errors do. Without a parsable request line the answer is the
Werk envelope. Messages are fixed texts: nothing the client sent (header lines may carry keys) is
echoed.
"""

from __future__ import annotations

import io
import secrets
import sys
from urllib.parse import urlsplit

import falcon

from werk_host.errors import ErrorCode, WerkError
from werk_host.http.app import _render_error
from werk_host.http.middleware import BodyTooLarge

#: A response as the server writes it: status line, headers, body.
Answer = tuple[str, list[tuple[str, str]], bytes]

#: The parser's own reasons that carry no client bytes, as the messages clients see.
_REASONS = {
    "Invalid header": "a header line is malformed (control bytes or invalid characters)",
    "Bare CR or LF found in HTTP message": "the request line holds a bare CR or LF",
    "HTTP message header invalid": "the request head is malformed",
    "Start line is invalid": "the request line is malformed",
    "Content-Length is invalid": "Content-Length is invalid",
    "Bad URI": "the request target is malformed",
    "Chunk not properly terminated": "a body chunk is not properly terminated",
    "Invalid chunk extension": "a body chunk extension is invalid",
    "Invalid chunk size": "a body chunk size is invalid",
}


def request_path(first_line: bytes | None) -> str:
    """The path of a request line (``METHOD TARGET VERSION``); ``/`` when there is none."""
    if not first_line:
        return "/"
    parts = first_line.split(b" ")
    if len(parts) != 3:
        return "/"
    try:
        path = urlsplit(parts[1].decode("latin-1")).path
    except ValueError:
        return "/"
    return path or "/"


def parse_error(first_line: bytes | None, code: int, reason: str) -> Answer:
    """The answer to a request the parser refused with HTTP ``code`` for ``reason``."""
    if code == 413:
        return render(first_line, BodyTooLarge(), 413)
    if code == 431:
        return render(first_line, WerkError(ErrorCode.INVALID_REQUEST, "the request headers exceed the limit"), 431)
    if code == 501:
        return render(first_line, WerkError(ErrorCode.UNSUPPORTED, "the transfer coding is not supported"), 501)
    if code >= 500:
        return render(first_line, WerkError(ErrorCode.INTERNAL, "internal error"), 500)
    message = "malformed HTTP request: " + _REASONS.get(reason, "the request cannot be parsed")
    return render(first_line, WerkError(ErrorCode.INVALID_REQUEST, message), 400)


def read_timeout(first_line: bytes | None, seconds: float) -> bytes:
    """The whole 408 response (with ``Connection: close``) to a request not received in time."""
    error = WerkError(ErrorCode.INVALID_REQUEST, f"the request was not received whole within {seconds:g} s")
    status, headers, body = render(first_line, error, 408)
    head = [f"HTTP/1.1 {status}", *(f"{name}: {value}" for name, value in headers)]
    head += [f"Content-Length: {len(body)}", "Connection: close"]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


def render(first_line: bytes | None, error: WerkError, status: int) -> Answer:
    """``error`` rendered by the app's error mapper for the request line's path, as ``status``."""
    environ = {
        "REQUEST_METHOD": "GET",
        "PATH_INFO": request_path(first_line),
        "QUERY_STRING": "",
        "SERVER_NAME": "werk-host",
        "SERVER_PORT": "0",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "wsgi.url_scheme": "http",
        "wsgi.input": io.BytesIO(),
        "wsgi.errors": sys.stderr,
    }
    req = falcon.Request(environ)
    req.context.request_id = f"req_{secrets.token_hex(12)}"
    resp = falcon.Response()
    _render_error(req, resp, error)
    headers = [(name.title(), value) for name, value in resp.headers.items()]
    return falcon.code_to_http_status(status), headers, (resp.text or "").encode("utf-8")

"""Browser safety (docs/operations.md, "Browser safety"): what keeps a web page in the user's
browser from driving a host, with or without API keys.

A page on another site can make the browser send requests that need no CORS preflight (a
``text/plain`` or form-encoded ``POST``, a form submission), and a page on a name it controls can
rebind that name to ``127.0.0.1`` (DNS rebinding), so that its requests reach the host as
same-origin ones under a foreign ``Host``. :class:`BrowserPolicy` refuses both, for every
request, before authentication:

* **Host**: the ``Host`` header's name (its port ignored) must be ``localhost`` (or a name under
  ``.localhost``), a loopback address, the address the host is bound to, this machine's host
  name, or one of ``--allowed-hosts``; bound to every interface (``0.0.0.0``/``::``), any IP
  literal passes too (a rebinding needs a name). ``--allowed-hosts '*'`` turns the check off
  (a reverse proxy that checks names itself). Otherwise 403 ``forbidden``. A request without
  ``Host`` (HTTP/1.0) is not a browser's and passes.
* **Origin**: a request that carries ``Origin`` passes when that origin is the request's own
  (scheme aside, its ``host[:port]`` is the ``Host`` header: the page ``/ui`` calling the API)
  or matches one of ``--allowed-origins`` (exact, ``*``, or ``fnmatch`` patterns such as
  ``http://localhost:*``); otherwise 403 ``forbidden``, ``Origin: null`` included. Only allowed
  cross-origin requests get CORS headers; their preflights (``OPTIONS`` with
  ``Access-Control-Request-Method``) are answered 204 before authentication, as browsers send
  them without credentials.
* **Content-Type**: a ``POST``/``PUT``/``PATCH`` that names a media type must name JSON
  (``application/json`` or ``application/*+json``, a ``charset`` only ``utf-8``); any other
  (``text/plain``, form encodings, multipart: what a page sends without a preflight) is 415
  ``invalid_request`` in the route family's error shape. A body without ``Content-Type`` is
  read as JSON, as most servers do for raw clients. The one exception is OpenAI's image edits
  route, which takes ``multipart/form-data`` (:data:`FORM_UPLOAD_PATHS`): a foreign page's form
  post there is still refused by the Origin check.
* ``/ui`` answers, 404s included, carry the page's security headers (docs/ui.md, "Security").
"""

from __future__ import annotations

import fnmatch
import functools
import ipaddress
import socket
from collections.abc import Iterable
from typing import Any, Final

import falcon

from werk_host.errors import ErrorCode, WerkError
from werk_host.http.errors import StatusError
from werk_host.http.ui import UI_PATH, security_headers

#: Host names that always reach this machine's loopback interface.
LOOPBACK_NAMES: Final = frozenset({"localhost", "127.0.0.1", "::1"})
_ANY_ADDRESS: Final = frozenset({"", "0.0.0.0", "::"})
_BODY_METHODS: Final = frozenset({"POST", "PUT", "PATCH"})
#: Response headers a cross-origin script may read (docs/operations.md, "Browser safety").
EXPOSED_HEADERS: Final = "X-Werk-Request-Id, X-Werk-Protocol-Version, Retry-After"
PREFLIGHT_METHODS: Final = "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"
PREFLIGHT_MAX_AGE_S: Final = 600


class UnsupportedMediaType(StatusError):
    """A body method naming a media type other than JSON (415, code ``invalid_request``)."""

    status = 415

    def __init__(self) -> None:
        super().__init__(
            ErrorCode.INVALID_REQUEST,
            "the request body must be JSON: send Content-Type: application/json",
            retryable=False,
        )


def _host_name(header: str) -> str:
    """The name in a ``Host`` header, lowercased, without its port or IPv6 brackets."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    name, _, port = header.rpartition(":")
    return name if name and port.isdigit() else header


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _is_loopback(name: str) -> bool:
    if name in LOOPBACK_NAMES or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


@functools.lru_cache(maxsize=256)  # clients send few distinct Content-Type headers
def _json_media(content_type: str) -> bool:
    media, *params = (part.strip().lower() for part in content_type.split(";"))
    kind, _, sub = media.partition("/")
    if kind != "application" or not (sub == "json" or sub.endswith("+json")):
        return False
    for param in params:
        name, _, value = param.partition("=")
        if name.strip() == "charset" and value.strip().strip('"') not in ("utf-8", "utf8"):
            return False
    return True


#: The one route that takes a non-JSON body: OpenAI's image edits, ``multipart/form-data``
#: (docs/media.md); its Host and Origin checks are those of every route.
FORM_UPLOAD_PATHS: Final = frozenset({"/v1/images/edits"})


def _form_upload(path: str, content_type: str) -> bool:
    return path in FORM_UPLOAD_PATHS and content_type.lower().startswith("multipart/form-data")


class BrowserPolicy:
    """The checks of the module docstring for a host bound to ``bound`` with the operator's
    ``allowed_hosts`` and ``allowed_origins``; :meth:`check` runs once per request."""

    def __init__(self, bound: str, allowed_hosts: Iterable[str] = (), allowed_origins: Iterable[str] = ()) -> None:
        hosts = {_host_name(h) for h in allowed_hosts if h.strip()}
        self.any_host = "*" in hosts
        bound_name = _host_name(bound)
        self.any_ip = bound_name in _ANY_ADDRESS
        machine = socket.gethostname().lower()
        self.hosts = frozenset(hosts | {bound_name, machine, machine.partition(".")[0]} - _ANY_ADDRESS)
        self.origins = tuple(o.strip().lower().rstrip("/") for o in allowed_origins if o.strip())
        self.any_origin = "*" in self.origins
        self._host_allowed = functools.lru_cache(maxsize=256)(self._judge_host)
        self._origin_allowed = functools.lru_cache(maxsize=256)(self._judge_origin)

    def _judge_host(self, header: str) -> bool:
        if self.any_host:
            return True
        name = _host_name(header)
        return _is_loopback(name) or name in self.hosts or (self.any_ip and _is_ip(name))

    def _judge_origin(self, origin: str) -> bool:
        """Whether ``origin`` is one of ``--allowed-origins`` (same-origin is judged per request)."""
        origin = origin.strip().lower().rstrip("/")
        return self.any_origin or any(fnmatch.fnmatchcase(origin, pattern) for pattern in self.origins)

    def check(self, req: falcon.Request, resp: falcon.Response) -> bool:
        """Refuse what the module docstring refuses (raises :class:`WerkError`); remember an
        allowed cross origin for :func:`respond`. ``True`` when the request was a preflight,
        now answered (the caller stops there)."""
        env = req.env
        host = env.get("HTTP_HOST")
        if host is not None and not self._host_allowed(host):
            raise WerkError(ErrorCode.FORBIDDEN, "this host name is not allowed (see --allowed-hosts)")
        origin = env.get("HTTP_ORIGIN")
        if origin is not None and not self._same_origin(origin, host):
            if not self._origin_allowed(origin):
                raise WerkError(ErrorCode.FORBIDDEN, "cross-origin requests from this origin are not allowed")
            req.context.cors_origin = origin
            if req.method == "OPTIONS" and "HTTP_ACCESS_CONTROL_REQUEST_METHOD" in env:
                self._preflight(env, resp)
                return True
        if req.method in _BODY_METHODS:
            content_type = env.get("CONTENT_TYPE")
            if content_type and not _json_media(content_type) and not _form_upload(req.path, content_type):
                raise UnsupportedMediaType()
        return False

    @staticmethod
    def _same_origin(origin: str, host: str | None) -> bool:
        if host is None:
            return False
        _scheme, sep, netloc = origin.partition("://")
        if not sep:
            return False  # "null" and other opaque origins
        netloc = netloc.lower()
        host = host.strip().lower()
        default = {"http": ":80", "https": ":443"}.get(_scheme.lower(), "")
        return netloc == host or netloc + default == host or netloc == host + default

    @staticmethod
    def _preflight(env: dict[str, Any], resp: falcon.Response) -> None:
        resp.status = 204
        resp.set_header("Access-Control-Allow-Methods", PREFLIGHT_METHODS)
        requested = env.get("HTTP_ACCESS_CONTROL_REQUEST_HEADERS")
        if requested:
            resp.set_header("Access-Control-Allow-Headers", requested)
        resp.set_header("Access-Control-Max-Age", str(PREFLIGHT_MAX_AGE_S))
        resp.complete = True


def is_ui_path(path: str) -> bool:
    return path == UI_PATH or path.startswith(UI_PATH + "/")


def respond(req: falcon.Request, resp: falcon.Response) -> None:
    """The answer's share of the policy, once everything else set its headers: CORS headers
    for an allowed cross origin; the page's security headers on every answer under ``/ui``,
    an unrouted 404 too (docs/ui.md, "Security")."""
    origin = getattr(req.context, "cors_origin", None)
    if origin is not None:
        resp.set_header("Access-Control-Allow-Origin", origin)
        resp.set_header("Access-Control-Expose-Headers", EXPOSED_HEADERS)
        resp.append_header("Vary", "Origin")
    if is_ui_path(req.path):
        security_headers(resp)


__all__ = ["BrowserPolicy", "UnsupportedMediaType", "is_ui_path", "respond"]

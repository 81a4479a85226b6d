"""The operator's page (docs/ui.md): ``GET /ui`` and ``GET /ui/{name}``, static files from
``werk_host/ui/static/`` inside the wheel.

Contract:

* ``/ui`` (and ``/ui/``) answers ``index.html``; ``/ui/{name}`` answers the file of that exact name when it is
  one of the files the static directory held when the app was built (a fixed table, read once:
  no path from the request ever reaches the filesystem, so ``..``, encoded slashes and links
  are simply unknown names). Anything else under ``/ui`` is 404 in the protocol's error shape.
* Only ``GET`` and ``HEAD``; no key is needed: the files hold no data. Every datum the page
  shows comes from the protocol's own routes, called by the page with the key the user typed
  (sent as ``Authorization: Bearer``, never in a URL), so a key sees exactly what the protocol
  lets it see.
* Every answer under ``/ui``, 404s included, carries a strict Content-Security-Policy
  (scripts, styles, connections only from this origin; no inline script or style; no
  framing), ``X-Content-Type-Options: nosniff``, ``Referrer-Policy: no-referrer`` and
  ``Cache-Control: no-cache``: the middleware sets them (werk_host/http/browser.py).
"""

from __future__ import annotations

from importlib import resources
from typing import Any, Final

import falcon

UI_PATH: Final = "/ui"

#: The page's Content-Security-Policy (docs/ui.md, "Security").
CONTENT_SECURITY_POLICY: Final = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; media-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'"
)

#: Content types by file suffix; a file with another suffix is not served.
CONTENT_TYPES: Final = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
}


def _load_static() -> dict[str, tuple[str, bytes]]:
    """Name → (content type, bytes) of every servable file directly in ``werk_host/ui/static``."""
    files: dict[str, tuple[str, bytes]] = {}
    root = resources.files("werk_host.ui").joinpath("static")
    for entry in root.iterdir():
        name = entry.name
        suffix = name[name.rfind(".") :] if "." in name else ""
        if name.startswith(".") or suffix not in CONTENT_TYPES or not entry.is_file():
            continue
        files[name] = (CONTENT_TYPES[suffix], entry.read_bytes())
    return files


def security_headers(resp: falcon.Response) -> None:
    resp.set_header("Content-Security-Policy", CONTENT_SECURITY_POLICY)
    resp.set_header("X-Content-Type-Options", "nosniff")
    resp.set_header("X-Frame-Options", "DENY")
    resp.set_header("Referrer-Policy", "no-referrer")
    resp.set_header("Cache-Control", "no-cache")


class UiResource:
    """Serves the page's static files from a table built once (see the module docstring)."""

    def __init__(self) -> None:
        self.files = _load_static()

    def _answer(self, resp: falcon.Response, name: str) -> None:
        found = self.files.get(name)
        if found is None:
            raise falcon.HTTPNotFound(description="no such file in the operator's page")
        resp.content_type, resp.data = found

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        self._answer(resp, "index.html")

    def on_get_file(self, req: falcon.Request, resp: falcon.Response, name: str) -> None:
        self._answer(resp, name)

    def on_head(self, req: falcon.Request, resp: falcon.Response) -> None:
        self.on_get(req, resp)

    def on_head_file(self, req: falcon.Request, resp: falcon.Response, name: str) -> None:
        self.on_get_file(req, resp, name)


def add_routes(app: falcon.App[Any, Any]) -> None:
    """Route ``/ui``, ``/ui/`` and ``/ui/{name}`` to one :class:`UiResource`."""
    resource = UiResource()
    app.add_route(UI_PATH, resource)
    app.add_route(UI_PATH + "/", resource)
    app.add_route(UI_PATH + "/{name}", resource, suffix="file")

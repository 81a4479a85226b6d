"""A minimal JSON-over-HTTP caller for tests against a real server (no client library).

:class:`Api` speaks the Werk wire format directly (``X-Werk-Protocol-Version``, bearer key),
so a test sees exactly what went over the wire: the status and the decoded JSON body.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode, urlsplit

#: A decoded JSON response body. Typed loosely on purpose: tests index into it freely.
JsonBody = dict[str, Any]
#: Query parameter values :meth:`Api.get` accepts.
ParamValue = str | int | float | bool | None


class Api:
    """Calls ``base`` (``http://host:port``) with ``key`` as the bearer key (none when ``None``)."""

    def __init__(self, base: str, key: str | None = None, *, timeout: float = 60.0) -> None:
        url = urlsplit(base)
        self.host, self.port = url.hostname or "127.0.0.1", url.port or 80
        self.key = key
        self.timeout = timeout

    @property
    def base(self) -> str:
        return f"http://{self.host}:{self.port}"

    def call(
        self, method: str, path: str, body: object = None, params: Mapping[str, ParamValue] | None = None
    ) -> tuple[int, JsonBody]:
        """``(status, decoded JSON body)`` of one request; ``body`` is sent as JSON when not ``None``.

        Boolean params are sent as ``true``/``false`` and ``None`` params are left out."""
        if params:
            query = {k: (str(v).lower() if isinstance(v, bool) else v) for k, v in params.items() if v is not None}
            path = f"{path}?{urlencode(query)}" if query else path
        headers = {"Accept": "application/json", "X-Werk-Protocol-Version": "1.0"}
        if self.key:
            headers["Authorization"] = f"Bearer {self.key}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            decoded: JsonBody = json.loads(resp.read())
            return resp.status, decoded
        finally:
            conn.close()

    def get(self, path: str, **params: ParamValue) -> tuple[int, JsonBody]:
        return self.call("GET", path, params=params or None)

    def post(self, path: str, body: object) -> tuple[int, JsonBody]:
        return self.call("POST", path, body)

    def as_key(self, key: str | None) -> Api:
        """The same server, called with another key (``None``: no key)."""
        return Api(self.base, key, timeout=self.timeout)


__all__ = ["Api", "JsonBody", "ParamValue"]

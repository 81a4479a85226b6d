"""A minimal JSON-over-HTTP caller for tests against a real server (no client library)."""

from __future__ import annotations

import http.client
import json
from typing import Any
from urllib.parse import urlencode, urlsplit


class Api:
    def __init__(self, base: str, key: str | None = None) -> None:
        url = urlsplit(base)
        self.host, self.port = url.hostname or "127.0.0.1", url.port or 80
        self.key = key

    def call(self, method: str, path: str, body: Any = None, params: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
        if params:
            path = f"{path}?{urlencode(params)}"
        headers = {"Accept": "application/json", "X-Werk-Protocol-Version": "1.0"}
        if self.key:
            headers["Authorization"] = f"Bearer {self.key}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
        try:
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            return resp.status, json.loads(resp.read())
        finally:
            conn.close()

    def get(self, path: str, **params: Any) -> tuple[int, dict[str, Any]]:
        return self.call("GET", path, params=params or None)

    def post(self, path: str, body: Any) -> tuple[int, dict[str, Any]]:
        return self.call("POST", path, body)

    def as_key(self, key: str) -> Api:
        other = Api("http://127.0.0.1", key)
        other.host, other.port = self.host, self.port
        return other

"""Opaque, tamper-evident page cursors bound to the principal and the query's filters."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

from werk_host.errors import ErrorCode, WerkError


class CursorCodec:
    def __init__(self, secret: bytes) -> None:
        self._key = hmac.new(secret, b"page-cursor", hashlib.sha256).digest()

    def _mac(self, payload: bytes, scope: str) -> str:
        return hmac.new(self._key, scope.encode() + b"\0" + payload, hashlib.sha256).hexdigest()[:32]

    def encode(self, after: str, scope: str) -> str:
        payload = json.dumps({"a": after}, separators=(",", ":")).encode()
        body = base64.urlsafe_b64encode(payload).decode().rstrip("=")
        return f"{body}.{self._mac(payload, scope)}"

    def decode(self, cursor: str, scope: str) -> str:
        """The position encoded in ``cursor``; a forged or foreign cursor is ``invalid_request``."""
        try:
            body, mac = cursor.split(".", 1)
            payload = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
            if not hmac.compare_digest(mac, self._mac(payload, scope)):
                raise ValueError("bad mac")
            after = json.loads(payload)["a"]
            if not isinstance(after, str):
                raise ValueError("bad cursor")
            return after
        except (ValueError, KeyError, TypeError, json.JSONDecodeError) as err:
            raise WerkError(ErrorCode.INVALID_REQUEST, "cursor is invalid") from err

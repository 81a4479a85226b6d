"""Helpers of the inference gate tests (docs/operations.md, "Inference concurrency")."""

from __future__ import annotations

import http.client
from collections.abc import Iterable

import pytest

#: Socket timeout of every request: a control route slower than this counts as starved.
TIMEOUT_S = 10.0
CONTROL_ROUTES = ("/werk/v1/info", "/werk/v1/capabilities", "/metrics", "/werk/v1/states")


def get_status(port: int, path: str, key: str) -> int:
    """The status of ``GET path`` as ``key`` on its own connection (times out after :data:`TIMEOUT_S`)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT_S)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {key}", "X-Werk-Protocol-Version": "1.0"})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def control_routes_answer(port: int, keys: Iterable[str], while_: str) -> None:
    """Every control route answers every key with 200 within :data:`TIMEOUT_S` (``while_``: what
    runs meanwhile, for the failure message)."""
    for key in keys:
        for path in CONTROL_ROUTES:
            try:
                status = get_status(port, path, key)
            except TimeoutError:
                pytest.fail(f"{path} starved while {while_} ran: no answer in {TIMEOUT_S}s")
            assert status == 200, (path, status)

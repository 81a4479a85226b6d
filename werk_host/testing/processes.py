"""Process helpers for tests that kill servers and watch their children, and whether this
machine prestarts remembered launches (docs/operations.md, "Remembered launches")."""

from __future__ import annotations

import time

import psutil  # type: ignore[import-untyped]

from werk_host.backends.launch import unavailable as prestart_unavailable

__all__ = ["gone", "prestart_unavailable"]


def gone(pid: int, timeout: float = 5.0) -> bool:
    """True once ``pid`` has exited within ``timeout`` (a zombie nobody reaps counts as exited)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)

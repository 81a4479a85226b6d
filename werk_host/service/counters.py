"""Server-wide chat counters shared by the inference routes and observability."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from werk_host.protocol import ChatCounters


class ChatStats:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._c = {k: 0 for k in ChatCounters.model_fields}

    def add(self, **deltas: int) -> None:
        with self._lock:
            for key, delta in deltas.items():
                self._c[key] += delta

    @contextmanager
    def request(self) -> Iterator[None]:
        """Count one inference request as active for its duration; failures are counted."""
        self.add(requests_total=1, requests_active=1)
        try:
            yield
        except BaseException:
            self.add(requests_failed=1)
            raise
        finally:
            self.add(requests_active=-1)

    def snapshot(self) -> ChatCounters:
        with self._lock:
            return ChatCounters(**self._c)

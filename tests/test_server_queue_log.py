"""waitress's per-request "Task queue depth" warning stays visible but is rate-limited."""

from __future__ import annotations

import logging
import threading

import falcon
import pytest

from werk_host.config import ServerLimits
from werk_host.logs import QueueDepthLog, RateLimitFilter
from werk_host.server import make_server


class _Blocking:
    """A waitress task that holds its worker thread until released."""

    def __init__(self, release: threading.Event, started: threading.Semaphore) -> None:
        self._release = release
        self._started = started

    def service(self) -> None:
        self._started.release()
        self._release.wait(30)

    def cancel(self) -> None:
        self._release.set()


def test_queued_requests_on_the_real_dispatcher_log_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    server = make_server(falcon.App(), "127.0.0.1", 0, ServerLimits(threads=1))
    assert isinstance(server.task_dispatcher.queue_logger, QueueDepthLog)
    release, started = threading.Event(), threading.Semaphore(0)
    try:
        with caplog.at_level(logging.WARNING, logger="waitress.queue"):
            server.task_dispatcher.add_task(_Blocking(release, started))
            assert started.acquire(timeout=30)  # the only worker is now busy
            for _ in range(50):
                server.task_dispatcher.add_task(_Blocking(release, started))
    finally:
        release.set()
        server.close()
        server.task_dispatcher.shutdown()
    records = [r for r in caplog.records if r.name == "waitress.queue"]
    assert len(records) == 1
    assert records[0].getMessage() == "Task queue depth is 1"


def test_suppressed_warnings_are_counted_on_the_next_one_and_pass_the_filter(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    logger = logging.getLogger("waitress.queue.gate-test")
    limiter = RateLimitFilter(interval=60, clock=lambda: now[0])
    logger.addFilter(limiter)
    try:
        gate = QueueDepthLog(logger, interval=60, clock=lambda: now[0])
        with caplog.at_level(logging.WARNING, logger=logger.name):
            for depth in range(1, 501):
                gate.warning("Task queue depth is %d", depth)
            now[0] = 30.0
            gate.warning("Task queue depth is %d", 9)
            now[0] = 60.0
            gate.warning("Task queue depth is %d", 7)
            gate.warning("Task queue depth is %d", 8)
            now[0] = 120.0
            gate.warning("Task queue depth is %d", 2)
    finally:
        logger.removeFilter(limiter)
    assert [r.getMessage() for r in caplog.records] == [
        "Task queue depth is 1",
        "Task queue depth is 7 (500 similar suppressed)",
        "Task queue depth is 2 (1 similar suppressed)",
    ]

"""Logging for ``werk serve``: JSON lines, secret redaction, and bounds on repeated records.

A client must not be able to flood the log (docs/operations.md, "Logs"):

* :class:`RateLimitFilter` lets one record per key through per interval and reports how many
  were suppressed on the next one it lets through (waitress's "Task queue depth" warning is
  keyed by message template and limited this way).
* :class:`QueueDepthLog` applies the same limit before a record is even made, in place of
  waitress's queue logger on ``werk serve``'s dispatcher: waitress warns on every request that
  waits for a worker, under its dispatcher lock, so making and dropping those records would
  cost the server more than the requests under load.
* :class:`TracebackThrottle` decides whether an unexpected error's traceback is logged: at most
  once per distinct error site (exception type, file and line of the innermost frame) per
  interval; every error still gets one line with its request id.
* :func:`public_log_lines` makes a backend's own log text fit for an operator's log tail
  (docs/deployments.md, "Operator actions"): secrets redacted, filesystem paths and process ids
  replaced by placeholders, control characters dropped, each line bounded.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any, Final

#: Seconds between two records of the same rate-limited kind, and two tracebacks of one site.
LOG_INTERVAL_S: Final = 60.0
#: Waitress's logger for its task-queue warnings.
WAITRESS_QUEUE_LOGGER: Final = "waitress.queue"
_MAX_KEYS: Final = 1024


#: The longest line :func:`public_log_lines` keeps (longer ones are cut, marked with ``…``).
PUBLIC_LINE_MAX: Final = 512
#: An absolute POSIX path (after a start, a space, a quote, ``=``, ``:`` or a bracket), a
#: home-relative one, or a Windows drive path; never a URL's ``//``.
_PATH = re.compile(r"""(?:(?<=^)|(?<=[\s'"=:(\[<,]))(?:~?/(?!/)|[A-Za-z]:\\)[^\s'"),\]>]*""")
#: A process id as logs name it: ``pid 123``, ``pid=123``, ``pid: 123``, ``PID 123``.
_PID = re.compile(r"(?i)\b(pid|ppid|tid)(\s*[=:]?\s*)\d+")
_CONTROL = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|[\x00-\x08\x0b-\x1f\x7f]")


def public_log_lines(text: str, secrets: tuple[str, ...] | list[str] = (), *, lines: int | None = None) -> list[str]:
    """The lines of a backend's own log ``text`` (the last ``lines`` of them), fit for an
    operator's log tail: every non-empty string of ``secrets`` becomes ``[redacted]``, every
    filesystem path ``<path>``, every process id ``<pid>``; control characters are dropped and
    each line is at most :data:`PUBLIC_LINE_MAX` characters."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "[redacted]")
    kept = text.splitlines()
    if lines is not None:
        kept = kept[-lines:] if lines > 0 else []
    out: list[str] = []
    for line in kept:
        line = _CONTROL.sub("", line)
        line = _PID.sub(lambda m: f"{m.group(1)}{m.group(2)}<pid>", _PATH.sub("<path>", line))
        out.append(line if len(line) <= PUBLIC_LINE_MAX else line[: PUBLIC_LINE_MAX - 1] + "…")
    return out


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg (+ exc)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry)


class RedactingFilter(logging.Filter):
    """Belt and braces: masks any configured secret that reaches a log record."""

    def __init__(self, secrets: tuple[str, ...]) -> None:
        super().__init__()
        self._secrets = tuple(s for s in secrets if len(s) >= 4)

    def filter(self, record: logging.LogRecord) -> bool:
        if self._secrets:
            message = record.getMessage()
            masked = message
            for secret in self._secrets:
                masked = masked.replace(secret, "[redacted]")
            if masked != message:
                record.msg, record.args = masked, None
        return True


class _Window:
    """Per-key "last let through" times and suppressed counts, bounded in size."""

    def __init__(self, interval: float, clock: Callable[[], float]) -> None:
        self.interval = interval
        self.clock = clock
        self._seen: dict[object, tuple[float, int]] = {}
        self._lock = threading.Lock()

    def admit(self, key: object) -> tuple[bool, int]:
        """Whether ``key`` may pass now, and how many of it were suppressed since it last did."""
        now = self.clock()
        with self._lock:
            last = self._seen.get(key)
            if last is not None and now - last[0] < self.interval:
                self._seen[key] = (last[0], last[1] + 1)
                return False, 0
            if last is None and len(self._seen) >= _MAX_KEYS:
                self._seen.clear()  # a flood of distinct keys degrades to "log each once more"
            self._seen[key] = (now, 0)
            return True, last[1] if last is not None else 0


class RateLimitFilter(logging.Filter):
    """At most one record per message template (logger, level, ``msg``) per ``interval``."""

    def __init__(self, interval: float = LOG_INTERVAL_S, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._window = _Window(interval, clock)

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, _PRELIMITED, False):
            return True  # limited by QueueDepthLog before it was made
        allowed, suppressed = self._window.admit((record.name, record.levelno, str(record.msg)))
        if allowed and suppressed:
            record.msg = f"{record.getMessage()} ({suppressed} similar suppressed)"
            record.args = None
        return allowed


#: ``extra`` marking a record that was rate-limited before it was made (RateLimitFilter passes it).
_PRELIMITED: Final = "werk_prelimited"


class QueueDepthLog:
    """Stands in for waitress's ``waitress.queue`` logger on a task dispatcher.

    Emits at most one "Task queue depth" warning per ``interval``, with the number of
    warnings suppressed since the last one, as :class:`RateLimitFilter` would; but decides
    before a log record is made, so a suppressed warning costs one clock read.
    """

    def __init__(
        self, logger: logging.Logger, interval: float = LOG_INTERVAL_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._logger = logger
        self._window = _Window(interval, clock)

    def warning(self, msg: str, *args: object) -> None:
        """Called by waitress as ``warning("Task queue depth is %d", depth)``."""
        allowed, suppressed = self._window.admit(msg)
        if not allowed:
            return
        if suppressed:
            self._logger.warning(f"{msg} ({suppressed} similar suppressed)", *args, extra={_PRELIMITED: True})
        else:
            self._logger.warning(msg, *args, extra={_PRELIMITED: True})


class TracebackThrottle:
    """Decides which unexpected errors get their traceback logged (once per site per interval)."""

    def __init__(self, interval: float = LOG_INTERVAL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._window = _Window(interval, clock)

    @staticmethod
    def site(error: BaseException) -> tuple[str, str, int]:
        """(exception type, file, line) of the innermost frame that raised ``error``."""
        frames = traceback.extract_tb(error.__traceback__)
        last = frames[-1] if frames else None
        if last is None:
            return type(error).__qualname__, "?", 0
        return type(error).__qualname__, last.filename, last.lineno or 0

    def should_log_traceback(self, error: BaseException) -> bool:
        allowed, _ = self._window.admit(self.site(error))
        return allowed


def configure_logging(level: str, secrets: tuple[str, ...]) -> None:
    """JSON lines on stderr with redaction; waitress's queue warnings rate-limited."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(RedactingFilter(secrets))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    queue = logging.getLogger(WAITRESS_QUEUE_LOGGER)
    if not any(isinstance(f, RateLimitFilter) for f in queue.filters):
        queue.addFilter(RateLimitFilter())

"""A media worker's streamed work, the adapter side (docs/plugin-kit.md, "Engine workers"): one
``POST`` to a worker route that answers NDJSON events (the kit's worker side,
:mod:`werk_host.plugin.engine_worker`, ``engine.stream``), read while holding the worker's one
seat. The diffusers worker's ``/images`` and the Qwen3-TTS worker's ``/speech`` are read here.

:func:`run_streamed` contract:

* **Seat and start.** It takes the pool's seat for the adapter's slot (starting the worker with
  ``start`` when none is alive) and holds the slot for the whole stream.
* **Events.** ``{"event": "progress", "step", "steps"}`` calls ``progress(step, steps)``;
  ``{"event": "result", ...}`` ends the work and is returned (the caller decodes it);
  ``{"event": "cancelled"}`` is ``conflict`` ("cancelled"); ``{"event": "error", "type",
  "message"}`` is ``invalid_request`` for ``ValueError``/``TypeError``/``KeyError`` (the
  request), else ``unavailable`` (retryable). Unknown events are skipped.
* **Cancel.** Between lines it polls ``cancelled()``; once true it closes the stream (the worker
  stops at its next step) and raises ``conflict`` ("cancelled"). The seat's wait and the first
  byte's give up on it too.
* **Faults.** A non-200 answer: 400 is ``invalid_request`` with the worker's message (bounded),
  anything else ``unavailable`` (retryable). A stream cut off (the worker died) or malformed is
  ``unavailable`` (retryable): the next request starts a new worker.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from typing import Any

from werk_host.errors import ErrorCode, WerkError
from werk_host.plugin.http import BackendCut, ClientGone, forward
from werk_host.plugin.pool import Slot, Started, WorkerPool
from werk_host.seam import client_disconnected

__all__ = ["MAX_LINE_BYTES", "ndjson_lines", "run_streamed", "stopped"]

MAX_LINE_BYTES = 256 << 20
_REQUEST_ERRORS = ("ValueError", "TypeError", "KeyError")


def ndjson_lines(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """The NDJSON lines of a streamed body, as they complete."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            if line.strip():
                yield line
        if len(pending) > MAX_LINE_BYTES:
            raise ValueError("a line of the worker's stream is too long")
    if pending.strip():
        yield pending


def run_streamed(
    pool: WorkerPool,
    slot: Slot,
    start: Callable[[], Started],
    path: str,
    body: dict[str, Any],
    *,
    label: str,
    cancelled: Callable[[], bool],
    progress: Callable[[int, int], None],
) -> dict[str, Any]:
    """The ``result`` event of ``POST path`` on the slot's worker (module docstring); ``label``
    names the worker in errors ("the <label> worker ...")."""
    if cancelled():
        raise WerkError(ErrorCode.CONFLICT, "cancelled")
    outer = client_disconnected.get()

    def gone() -> bool:
        return cancelled() or (outer is not None and outer())

    token = client_disconnected.set(gone)  # the seat's wait and the first byte's give up on it
    try:
        with pool.use(slot, start) as current, slot.hold():
            response = forward(current.pool, path, body)
            try:
                return _read(response.status, response.body, label, cancelled, progress)
            finally:
                response.close()
    except (ClientGone, WerkError) as err:
        if cancelled() and not isinstance(err, BackendCut):
            raise WerkError(ErrorCode.CONFLICT, "cancelled") from err
        raise
    finally:
        client_disconnected.reset(token)


def _read(
    status: int,
    chunks: Iterator[bytes],
    label: str,
    cancelled: Callable[[], bool],
    progress: Callable[[int, int], None],
) -> dict[str, Any]:
    if status != 200:
        raw = b"".join(chunks)[:4096]
        message = ""
        with contextlib.suppress(ValueError, AttributeError):
            message = str(json.loads(raw).get("error", {}).get("message", ""))[:300]
        if status == 400:
            raise WerkError(ErrorCode.INVALID_REQUEST, f"the {label} worker refused the request: {message}")
        raise WerkError(
            ErrorCode.UNAVAILABLE, f"the {label} worker could not run the request ({status})", retryable=True
        )
    try:
        for line in ndjson_lines(chunks):
            if cancelled():
                raise WerkError(ErrorCode.CONFLICT, "cancelled")
            event = json.loads(line)
            kind = event.get("event") if isinstance(event, dict) else None
            if kind == "progress":
                progress(int(event["step"]), int(event["steps"]))
            elif kind == "result":
                result: dict[str, Any] = event
                return result
            elif kind == "cancelled":
                raise WerkError(ErrorCode.CONFLICT, "cancelled")
            elif kind == "error":
                kind, message = str(event.get("type", "")), str(event.get("message", ""))[:300]
                if kind in _REQUEST_ERRORS:
                    raise WerkError(ErrorCode.INVALID_REQUEST, f"the {label} engine refused the request: {message}")
                raise WerkError(ErrorCode.UNAVAILABLE, f"the {label} engine failed ({kind}): {message}", retryable=True)
    except BackendCut as err:
        raise stopped(label) from err
    except (ValueError, KeyError, TypeError) as err:
        raise WerkError(
            ErrorCode.UNAVAILABLE, f"the {label} worker answered a malformed stream", retryable=True
        ) from err
    raise stopped(label)


def stopped(label: str) -> WerkError:
    """The error of a worker that died during the work."""
    return WerkError(ErrorCode.UNAVAILABLE, f"the {label} worker stopped during the generation", retryable=True)

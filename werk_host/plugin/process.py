"""Managed worker processes for backend plugins: start, watch and stop an engine's process,
its private run directory, and finding its executable (docs/plugin-kit.md, "Processes").

Every managed child dies with Werk. An engine that starts processes of its own (workers, an
engine core) runs under the one process-group guard, ``ManagedProcess(..., guard="group")``:
when Werk dies by any means, the engine's whole process group is killed with it
(:mod:`werk_host.backends.child`). A child started through :func:`reserve` (its generation,
secret, port and run directory) and ``ManagedProcess(..., launch=reservation)`` starts at once
on the next ``werk serve`` of the same command (:mod:`werk_host.backends.launch`).
:mod:`werk_host.plugin.workers` builds a whole engine worker
(run directory, key, readiness) on top of these. :func:`public_log_lines` makes a native log
tail fit for an operator (``werk_log_tail``: secrets, paths and process ids replaced)."""

from __future__ import annotations

from werk_host.backends.child import Guard, create_run_dir
from werk_host.backends.launch import Reservation, reserve
from werk_host.backends.managed import (
    LOG_TAIL_LINES,
    BackendProcessError,
    BackendStartupError,
    ManagedProcess,
    find_executable,
    free_port,
    http_ready,
    is_executable_file,
    live_children,
)
from werk_host.backends.records import reap_stale_run_dirs
from werk_host.logs import public_log_lines

__all__ = [
    "LOG_TAIL_LINES",
    "BackendProcessError",
    "BackendStartupError",
    "Guard",
    "ManagedProcess",
    "Reservation",
    "create_run_dir",
    "find_executable",
    "free_port",
    "http_ready",
    "is_executable_file",
    "live_children",
    "public_log_lines",
    "reap_stale_run_dirs",
    "reserve",
]

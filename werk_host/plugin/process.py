"""Managed worker processes for backend plugins: start, watch and stop an engine's process,
its private run directory, and finding its executable (docs/plugin-kit.md, "Processes")."""

from __future__ import annotations

from werk_host.backends.child import create_run_dir, reap_stale_run_dirs
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

__all__ = [
    "LOG_TAIL_LINES",
    "BackendProcessError",
    "BackendStartupError",
    "ManagedProcess",
    "create_run_dir",
    "find_executable",
    "free_port",
    "http_ready",
    "is_executable_file",
    "live_children",
    "reap_stale_run_dirs",
]

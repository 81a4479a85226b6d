"""The whole Werk conformance suite against a real llama-server (generated tiny model)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from werk_llamacpp.adapter import LlamaCppAdapter

from werk_host.plugin import Adapter
from werk_host.testing.conformance import ConformanceTarget, WerkConformance
from werk_host.testing.processes import gone

pytestmark = pytest.mark.llamaserver


def kill_child(adapter: Adapter) -> None:
    """Replace the backend process the hard way: SIGKILL the live llama-server child."""
    assert isinstance(adapter, LlamaCppAdapter)
    proc = adapter.current()
    assert proc is not None and proc.pid is not None
    os.kill(proc.pid, signal.SIGKILL)
    assert gone(proc.pid, timeout=10)
    deadline = time.monotonic() + 10  # /proc shows the zombie a moment before waitid() reports it
    while adapter.current() is not None and time.monotonic() < deadline:
        time.sleep(0.01)


class TestConformance(WerkConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def conformance_target(cls, llama_server_path: Path, tiny_model: Path) -> ConformanceTarget:
        return ConformanceTarget(
            entry_point="llamacpp",  # loaded as a user's install loads it
            model=tiny_model,
            model_name="tiny-llama",
            replace_process=kill_child,
            backend_options={"llamacpp": {"llama_server": str(llama_server_path), "parallel": 2}},
        )

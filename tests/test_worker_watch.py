"""WorkerWatch answers a fresh observation without a call, unless a process it names has
exited (a backend that replaces its own child keeps its adapter; werk_host/deployments/observe.py)."""

from __future__ import annotations

import subprocess
import sys

from werk_host.deployments.observe import WorkerWatch
from werk_host.protocol.telemetry import WorkerObservation


def test_a_fresh_observation_naming_a_dead_process_is_observed_again() -> None:
    watch = WorkerWatch(wait_s=5.0, fresh_s=3600.0)
    adapter = object()
    first = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    second = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        current = [first.pid]
        calls: list[int] = []

        def call(_: object) -> list[WorkerObservation]:
            calls.append(current[0])
            return [
                WorkerObservation(
                    model="m",
                    backend="b",
                    pid=current[0],
                    state="ready",
                    slots=1,
                    context_per_request_tokens=None,
                    context_capacity_tokens=None,
                )
            ]

        assert [w.pid for w in watch.observe("i", adapter, call) or []] == [first.pid]  # type: ignore[arg-type]
        assert [w.pid for w in watch.observe("i", adapter, call) or []] == [first.pid]  # type: ignore[arg-type]
        assert len(calls) == 1  # fresh and alive: no second call
        first.kill()
        first.wait()
        current[0] = second.pid
        assert [w.pid for w in watch.observe("i", adapter, call) or []] == [second.pid]  # type: ignore[arg-type]
        assert len(calls) == 2
    finally:
        for proc in (first, second):
            proc.kill()
            proc.wait()

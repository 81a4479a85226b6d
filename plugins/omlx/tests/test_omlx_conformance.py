"""The plugin kit's conformance suite against the oMLX backend on real MLX.

The host runs with ``WERK_OMLX_EXPERT_CACHE_MB=2`` and one chat is served before the suite, so
the expert routes are checked in their ``experimental`` state (a loaded worker confirmed
offload); ``replace_process`` SIGKILLs the worker, which the next request replaces.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import manifest_of
from werk_omlx import plugin
from werk_omlx.adapter import ENV_BUDGET, OmlxAdapter

from werk_host.plugin import Adapter, CapabilityId, CapabilityStatus
from werk_host.testing.conformance import ConformanceHost, ConformanceTarget, WerkConformance

pytestmark = pytest.mark.mlx


def kill_workers(adapter: Adapter) -> None:
    assert isinstance(adapter, OmlxAdapter)
    for worker in adapter.live_workers():
        assert worker.pid is not None
        os.killpg(worker.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while worker.alive() and time.monotonic() < deadline:
            time.sleep(0.05)


class TestOmlxConformance(WerkConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def conformance_target(cls, moe_f32: Path) -> Iterator[ConformanceTarget]:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(ENV_BUDGET, "2")
            yield ConformanceTarget(
                plugin=plugin, plugin_name="omlx", model=manifest_of(moe_f32), replace_process=kill_workers
            )

    @pytest.fixture(scope="class", autouse=True)
    @classmethod
    def _loaded(cls, conformance_host: ConformanceHost) -> None:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0}
        status, doc = conformance_host.api.call("POST", "/v1/chat/completions", body)
        assert status == 200, doc
        assert conformance_host.statuses()[CapabilityId.EXPERTS] is CapabilityStatus.EXPERIMENTAL

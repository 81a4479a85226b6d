"""The memory estimate drives residency (docs/deployments.md, "Memory estimate", "Eviction
order"), over the reference backend on a real waitress server, with the host's memory telemetry
reading figures the test sets (:mod:`werk_host.testing.memory`):

* before its first start an instance needs its model files, the KV cache its backend's factory
  estimates and the documented overhead, as the inventory reports;
* a start that fits only once an idle instance is unloaded unloads it, in host memory and, for
  a backend that places its layers on an accelerator, in accelerator memory;
* a start that cannot fit even with every candidate unloaded is refused at once with
  ``resource_exhausted``, naming the pool and the figures, and unloads nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from werk_host.deployments.footprint import OVERHEAD_BYTES
from werk_host.protocol.deployments import InstanceStateName
from werk_host.seam import MemoryEstimate
from werk_host.testing.api import Api
from werk_host.testing.hosts import backend_host, running
from werk_host.testing.memory import SnapshotPool, snapshot_memory

LOADED = (InstanceStateName.READY, InstanceStateName.STOPPING)
GIB = 1 << 30
MIB = 1 << 20
KV = GIB

PROFILE = (
    '[[instance]]\nid = "a"\nmodel = "tiny"\n'
    '[[instance]]\nid = "b"\nmodel = "tiny"\n'
    '[[instance]]\nid = "big"\nmodel = "tiny"\nmemory = "3GiB"\n'
)


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Any]:
    """Start a host whose memory telemetry reports ``host`` (and ``gpu``) less what its loaded
    instances hold: the footprint residency accounts for them, as a machine would show it."""
    stack: list[Any] = []

    def start(estimate: MemoryEstimate, host: SnapshotPool, gpu: SnapshotPool | None = None) -> str:
        home = tmp_path / "home"
        home.mkdir()
        profile = tmp_path / "deployments.toml"
        profile.write_text(PROFILE)
        built, _ = backend_host(
            home, profile=profile, adapter_kwargs={"memory_estimate": estimate}, memory=snapshot_memory(host, gpu)
        )
        deployments = built.fleet.deployments
        assert deployments is not None

        def held(pool: str) -> int:
            loaded = [i for i in deployments.instances.values() if i.view().state in LOADED]
            return sum(getattr(deployments.residency.footprint(i), pool) for i in loaded)

        host.held = lambda: held("host")
        if gpu is not None:
            gpu.held = lambda: held("accelerator")
        context = running(built)
        stack.append(context)
        return context.__enter__()

    yield start
    for context in reversed(stack):
        context.__exit__(None, None, None)


def _chat(api: Api, model: str) -> tuple[int, Any]:
    return api.post(
        "/v1/chat/completions", {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    )


def _inventory(api: Api) -> dict[str, dict[str, Any]]:
    status, doc = api.get("/werk/v1/deployments")
    assert status == 200, doc
    return {i["id"]: i for i in doc["data"]["inventory"]}


def _states(api: Api) -> dict[str, str]:
    return {k: v["state"] for k, v in _inventory(api).items()}


def _weights(tmp_path: Path) -> int:
    return (tmp_path / "tiny.bin").stat().st_size


def test_a_start_that_fits_only_after_an_eviction_evicts(serve: Any, tmp_path: Path) -> None:
    host = SnapshotPool(16 * GIB, 2 * GIB)
    api = Api(serve(MemoryEstimate(kv_bytes=KV, context_tokens=8192), host))
    need = _weights(tmp_path) + KV + OVERHEAD_BYTES
    assert _inventory(api)["a"]["memory_estimate_bytes"] == need  # before any start
    assert _chat(api, "a")[0] == 200
    assert _chat(api, "b")[0] == 200
    assert _states(api) == {"a": "cold", "b": "ready", "big": "cold"}
    _, logs = Api(api.base).get("/werk/v1/deployments/a/logs")
    assert any("unloaded to load b (memory)" in line for line in logs["data"]["lines"]), logs


def test_a_start_that_can_never_fit_is_refused_with_the_figures(serve: Any, tmp_path: Path) -> None:
    host = SnapshotPool(16 * GIB, 2 * GIB)
    api = Api(serve(MemoryEstimate(kv_bytes=KV, context_tokens=8192), host))
    need = _weights(tmp_path) + KV + OVERHEAD_BYTES
    assert _chat(api, "b")[0] == 200
    status, body = _chat(api, "big")
    assert status == 429 and body["error"]["code"] == "resource_exhausted", body
    message = body["error"]["message"]
    assert "instance big needs about 3072 MiB of host memory (memory 3072 MiB)" in message, message
    can = (2 * GIB - need + need) >> 20
    assert f"only {can} MiB can be made available ({(2 * GIB - need) >> 20} MiB available now, plus " in message
    assert f"{need >> 20} MiB from unloading b;" in message, message
    assert _states(api) == {"a": "cold", "b": "ready", "big": "failed"}  # nothing was unloaded for it


def test_accelerator_memory_decides_for_layers_on_the_accelerator(serve: Any, tmp_path: Path) -> None:
    host, gpu = SnapshotPool(64 * GIB, 60 * GIB), SnapshotPool(24 * GIB, GIB + GIB // 2)
    api = Api(serve(MemoryEstimate(kv_bytes=KV, context_tokens=8192, accelerator_share=1.0), host, gpu))
    on_gpu = _weights(tmp_path) + KV
    assert _inventory(api)["a"]["memory_estimate_bytes"] == on_gpu + OVERHEAD_BYTES
    assert _chat(api, "a")[0] == 200
    assert _chat(api, "b")[0] == 200  # host memory is plenty: the accelerator is what a held
    assert _states(api) == {"a": "cold", "b": "ready", "big": "cold"}
    status, body = _chat(api, "big")  # its declared memory, all of it on the accelerator
    assert status == 429, body
    message = body["error"]["message"]
    assert "instance big needs about 3072 MiB of accelerator memory (memory 3072 MiB) but only " in message
    free = GIB + GIB // 2 - on_gpu
    assert f"only {(free + on_gpu) >> 20} MiB can be made available ({free >> 20} MiB available now, plus " in message
    assert f"{on_gpu >> 20} MiB from unloading b;" in message, message
    assert _states(api)["b"] == "ready"
    a = _inventory(api)["a"]
    assert a["state"] == "cold" and a["memory_estimate_bytes"] == on_gpu + OVERHEAD_BYTES

"""Residency over deployments: one loaded model per manifest identity shared by its instances,
failures kept on their instance, checksum-sensitive loading, and weights freed when an instance
stops (keep_alive) — measured on the real SmolLM2."""

from __future__ import annotations

import gc
import http.client
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]
import pytest
from werk_candle_bridge import plugin
from werk_candle_bridge.adapter import CandleAdapter
from werk_candle_bridge.engine import EngineSettings, load_engine
from werk_candle_bridge.template import engine_template
from werk_llamacpp.testing.testmodel import generate_model

from werk_host.plugin import HostConfig, ModelManifest
from werk_host.testing.host import Host, ModelRegistry, PluginHost, build_host
from werk_host.testing.hosts import running

pytestmark = pytest.mark.engine
KEY = "sk-werk-candle-deployments-19"
MiB = 1 << 20

PROFILE = """
[[instance]]
id = "a1"
model = "model-a"
default = true

[[instance]]
id = "a2"
model = "model-a"

[[instance]]
id = "broken"
model = "broken-model"

[[instance]]
id = "changed"
model = "changed-model"

[[instance]]
id = "lazy"
model = "model-c"
keep_alive = "1s"
"""

MEMORY_PROFILE = """
[[instance]]
id = "smol"
model = "smol"
keep_alive = "1s"
"""


@dataclass
class Env:
    url: str
    host: Host

    def call(self, method: str, path: str, body: Any = None, deployment: str | None = None) -> tuple[int, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", int(self.url.rsplit(":", 1)[1]), timeout=120)
        headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
        if deployment is not None:
            headers["X-Werk-Deployment"] = deployment
        try:
            conn.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
            return resp.status, json.loads(raw) if raw else None
        finally:
            conn.close()

    def chat(self, instance: str) -> tuple[int, Any]:
        body = {"model": instance, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}
        return self.call("POST", "/v1/chat/completions", body)

    def adapter(self, instance: str) -> CandleAdapter:
        deployments = self.host.fleet.deployments
        assert deployments is not None
        adapter = deployments.instances[instance].peek()
        assert isinstance(adapter, CandleAdapter), f"instance {instance} is not ready"
        return adapter

    def state(self, instance: str) -> str:
        status, doc = self.call("GET", "/werk/v1/deployments")
        assert status == 200, doc
        return str(next(i for i in doc["data"]["inventory"] if i["id"] == instance)["state"])

    def adapter_gone(self, instance: str) -> bool:
        deployments = self.host.fleet.deployments
        assert deployments is not None
        return deployments.instances[instance].peek() is None

    def wait_state(self, instance: str, wanted: str, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while self.state(instance) != wanted:
            assert time.monotonic() < deadline, f"{instance} never became {wanted}"
            time.sleep(0.1)


def _host(root: Path, profile: str, models: dict[str, Path]) -> Host:
    home = root / "home"
    home.mkdir()
    registry = ModelRegistry(home)
    for name, path in models.items():
        registry.add(ModelManifest.from_paths(name, [path], backend="candle"))
    (root / "deployments.toml").write_text(profile)
    plugins = PluginHost()
    plugins.register(plugin, "candle")
    return build_host(HostConfig(home=home, api_keys=(KEY,), profile=root / "deployments.toml"), plugins=plugins)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root = tmp_path_factory.mktemp("candle-deployments")
    a = generate_model(root / "a.gguf", seed=1)
    c = generate_model(root / "c.gguf", seed=3, dim=32)
    broken = root / "broken.gguf"
    broken.write_bytes(a.read_bytes()[: a.stat().st_size // 2])  # a valid header, then nothing
    changed = generate_model(root / "changed.gguf", seed=4)
    models = {"model-a": a, "model-c": c, "broken-model": broken, "changed-model": changed}
    host = _host(root, PROFILE, models)
    data = bytearray(changed.read_bytes())  # replaced after registration: same size, other bytes
    data[-1] ^= 0xFF
    changed.write_bytes(bytes(data))
    with running(host) as url:
        yield Env(url, host)


def test_instances_of_one_model_share_one_load(env: Env) -> None:
    status, doc = env.chat("a1")
    assert status == 200, doc
    status, doc = env.chat("a2")
    assert status == 200, doc
    first, second = env.adapter("a1"), env.adapter("a2")
    assert first.shared is second.shared
    assert first.identity().split("#")[1] == second.identity().split("#")[1] != "none"
    status, doc = env.call("GET", "/werk/v1/capabilities", deployment="a2")
    residency = next(c for c in doc["data"] if c["id"] == "runtime.model_residency")
    assert residency["status"] == "supported"


def test_a_model_the_engine_cannot_load_fails_only_its_instance(env: Env, tmp_path: Path) -> None:
    status, doc = env.chat("broken")
    assert status == 503, doc
    error = doc["error"]
    assert error["code"] == "unavailable" and "could not load model broken-model" in error["message"]
    assert "/" not in error["message"] and "candle_core" not in error["message"]
    status, doc = env.call("GET", "/werk/v1/capabilities", deployment="broken")
    residency = next(c for c in doc["data"] if c["id"] == "runtime.model_residency")
    assert residency["status"] == "unavailable" and "could not load" in residency["detail"]
    status, doc = env.chat("a1")
    assert status == 200, doc


def test_a_file_changed_since_registration_is_refused(env: Env) -> None:
    status, doc = env.chat("changed")
    assert status == 503, doc
    assert "changed since it was registered" in doc["error"]["message"]
    assert env.adapter("changed").shared.loaded() is None


def test_keep_alive_unloads_and_the_next_use_loads_again(env: Env) -> None:
    status, doc = env.chat("lazy")
    assert status == 200, doc
    adapter = env.adapter("lazy")
    shared, before = adapter.shared, adapter.identity()
    assert shared.loaded() is not None
    env.wait_state("lazy", "cold")
    assert shared.loaded() is None  # the engine was closed with the instance
    status, doc = env.chat("lazy")
    assert status == 200, doc
    assert env.adapter("lazy").identity() != before


# -- memory ------------------------------------------------------------------------------------------


def _rss() -> int:
    gc.collect()
    return int(psutil.Process().memory_info().rss)


def test_unloading_hands_the_weights_back(smollm2_gguf: Path, tiny_gguf: Path, tmp_path: Path) -> None:
    # The engine's own runtime (threads, allocator arenas) stays once started: start it first
    # with the tiny model, so that the samples below see the model's weights alone.
    template = tmp_path / "warm.jinja"
    template.write_text(engine_template(None))
    load_engine(tiny_gguf, template, EngineSettings()).close()
    host = _host(tmp_path, MEMORY_PROFILE, {"smol": smollm2_gguf})
    count = {"model": "smol", "messages": [{"role": "user", "content": "hi"}]}
    with running(host) as url:
        env = Env(url, host)
        samples: list[tuple[int, int]] = []
        for _ in range(2):
            before = _rss()
            status, doc = env.call("POST", "/werk/v1/chat/count_tokens", count, deployment="smol")
            assert status == 200, doc  # counting loads the model
            loaded = _rss()
            env.wait_state("smol", "cold")
            samples.append((before, loaded))
            assert env.adapter_gone("smol")
        after = _rss()
    (base, loaded1), (again, loaded2) = samples
    weights = loaded1 - base
    assert weights > 100 * MiB, samples  # the model really was in memory
    assert again - base < weights / 4, (samples, after)  # the first unload gave most of it back
    assert after - base < weights / 4, (samples, after)  # and a second load/unload leaks nothing more
    assert loaded2 - again > 100 * MiB

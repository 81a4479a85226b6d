"""Deployments over real llama-server children: one host, two generated models, three instances
(two replicas of model A behind the alias ``chat``, one of model B), plus a lazy instance with a
short keep_alive and one whose model file is broken."""

from __future__ import annotations

import http.client
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]
import pytest
from werk_llamacpp import plugin as llama_plugin
from werk_llamacpp.testing.testmodel import generate_model

from werk_host.plugin import HostConfig, ModelManifest, ServerLimits
from werk_host.testing.host import Host, ModelRegistry, PluginHost, build_host
from werk_host.testing.hosts import running
from werk_host.testing.processes import gone

pytestmark = pytest.mark.llamaserver
KEY = "sk-werk-deployments-test-5521"

PROFILE = """
[[instance]]
id = "a1"
model = "model-a"
options = { parallel = 2, ctx = 4096 }
preload = true
default = true

[[instance]]
id = "a2"
model = "model-a"
options = { parallel = 1, ctx = 1024 }
preload = true

[[instance]]
id = "b"
model = "model-b"
options = { parallel = 1, ctx = 2048 }
preload = true

[[instance]]
id = "lazy"
model = "model-b"
keep_alive = "1s"

[[instance]]
id = "broken"
model = "broken-model"

[alias.chat]
replicas = ["a1", "a2"]
"""


@dataclass
class Env:
    url: str
    host: Host
    home: Path

    def call(
        self, method: str, path: str, body: Any = None, deployment: str | None = None
    ) -> tuple[int, dict[str, str], Any]:
        conn = http.client.HTTPConnection("127.0.0.1", int(self.url.rsplit(":", 1)[1]), timeout=120)
        headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
        if deployment is not None:
            headers["X-Werk-Deployment"] = deployment
        try:
            conn.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, json.loads(raw) if raw else None
        finally:
            conn.close()

    def chat(self, model: str | None, text: str = "hello") -> tuple[int, dict[str, str], Any]:
        body: dict[str, Any] = {"messages": [{"role": "user", "content": text}], "max_tokens": 2, "temperature": 0}
        if model is not None:
            body["model"] = model
        return self.call("POST", "/v1/chat/completions", body)

    def inventory(self) -> dict[str, dict[str, Any]]:
        status, _, doc = self.call("GET", "/werk/v1/deployments")
        assert status == 200, doc
        return {i["id"]: i for i in doc["data"]["inventory"]}

    def deployments(self) -> dict[str, Any]:
        status, _, doc = self.call("GET", "/werk/v1/deployments")
        assert status == 200, doc
        data: dict[str, Any] = doc["data"]
        return data

    def prefill(self, deployment: str) -> str:
        body = {"model_id": self.model_of(deployment), "input": {"type": "text", "text": "a b c"}}
        body["allow_experimental"] = True
        body["policy"] = {"mode": "ephemeral", "reuse": "disabled"}
        status, _, doc = self.call("POST", "/werk/v1/prefill", body, deployment=deployment)
        assert status == 200, doc
        handoff: str = doc["data"]["handoff"]
        return handoff

    def decode(self, deployment: str, handoff: str) -> int:
        body = {"handoff": handoff, "max_tokens": 2, "allow_experimental": True}
        status, _, _ = self.call("POST", "/werk/v1/decode", body, deployment=deployment)
        return status

    def model_of(self, deployment: str) -> str:
        return "model-a" if deployment.startswith("a") else "model-b"


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, llama_server_path: Path) -> Iterator[Env]:
    root = tmp_path_factory.mktemp("deployments")
    home = root / "home"
    home.mkdir()
    registry = ModelRegistry(home)
    a = generate_model(root / "a.gguf", seed=1)
    b = generate_model(root / "b.gguf", seed=2, dim=32)
    broken = root / "broken.gguf"
    broken.write_bytes(b"GGUF" + os.urandom(4096))  # the magic of a GGUF, and nothing a loader can use
    for name, path in (("model-a", a), ("model-b", b), ("broken-model", broken)):
        registry.add(ModelManifest.from_paths(name, [path], backend="llama.cpp"))
    profile = root / "deployments.toml"
    profile.write_text(PROFILE)
    plugins = PluginHost()
    plugins.register(llama_plugin, "llamacpp")
    config = HostConfig(
        home=home,
        api_keys=(KEY,),
        profile=profile,
        backend_options={"llamacpp": {"llama_server": str(llama_server_path)}},
        # one key's 16-request burst is admitted whole (docs/operations.md, "Inference concurrency")
        limits=ServerLimits(threads=40, inference_per_key=16),
    )
    host = build_host(config, plugins=plugins)
    with running(host) as url:
        yield Env(url, host, home)


def test_inventory_plans_and_slots(env: Env) -> None:
    doc = env.deployments()
    inventory = {i["id"]: i for i in doc["inventory"]}
    assert set(inventory) == {"a1", "a2", "b", "lazy", "broken"}
    assert inventory["a1"]["aliases"] == ["chat"] and inventory["a1"]["default"] is True
    assert inventory["b"]["aliases"] == [] and inventory["b"]["model"] == "model-b"
    for ready in ("a1", "a2", "b"):
        assert inventory[ready]["state"] == "ready" and inventory[ready]["backend"] == "llama.cpp"
        assert psutil.Process(inventory[ready]["pid"]).is_running()
        assert inventory[ready]["endpoint"] == "local"
    assert inventory["lazy"]["state"] in ("cold", "ready") and inventory["lazy"]["keep_alive_seconds"] == 1.0
    plans = {p["instance"]: p["plan"] for p in doc["plans"]}
    assert (plans["a1"]["parallel_slots"], plans["a1"]["context_per_slot"]) == (2, 2048)
    assert (plans["a2"]["parallel_slots"], plans["a2"]["context_per_slot"]) == (1, 1024)
    assert plans["broken"] is None
    assert not any(arg.startswith("/") for plan in plans.values() if plan for arg in plan["arguments"])
    slots = {s["instance"]: s for s in doc["slots"]}
    assert slots["a1"] == {"instance": "a1", "total": 2, "busy": 0, "free": 2}
    assert slots["broken"]["total"] is None


def test_routing_by_instance_model_and_alias(env: Env) -> None:
    for model, served_by in (("a2", {"a2"}), ("b", {"b"}), ("model-b", {"b", "lazy"}), ("chat", {"a1", "a2"})):
        status, headers, doc = env.chat(model)
        assert status == 200, doc
        assert headers["x-werk-deployment"] in served_by
    status, headers, _ = env.chat(None)
    assert (status, headers["x-werk-deployment"]) == (200, "a1")  # the default instance
    status, _, doc = env.chat("no-such-model")
    assert status == 404 and doc["error"]["code"] == "model_not_found"
    status, _, doc = env.call("GET", "/v1/models")
    assert {m["id"] for m in doc["data"]} == {"a1", "a2", "b", "lazy", "broken", "chat"}


def test_answers_name_the_model_as_asked(env: Env) -> None:
    """Issue 48, item 7: llama-server reports its own alias (the model name); every answer,
    whole or streamed, names the model as the request gave it, and ``NAME:latest`` resolves on
    ``/v1`` as on the Ollama routes."""
    for model in ("a2", "model-b", "chat", "chat:latest", "a1:latest"):
        status, _, doc = env.chat(model)
        assert (status, doc["model"]) == (200, model), doc
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True}
        conn = http.client.HTTPConnection("127.0.0.1", int(env.url.rsplit(":", 1)[1]), timeout=120)
        headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
        conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers=headers)
        lines = conn.getresponse().read().decode().splitlines()
        conn.close()
        events = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
        assert events and {e["model"] for e in events} == {model}, lines
        status, _, doc = env.call("POST", "/v1/completions", {"model": model, "prompt": "hi", "max_tokens": 2})
        assert (status, doc["model"]) == (200, model), doc
    status, _, doc = env.chat(None)
    assert (status, doc["model"]) == (200, "a1"), doc  # without a name: the serving instance's id


def test_an_alias_spreads_requests_over_its_replicas(env: Env) -> None:
    served = [env.chat("chat")[1]["x-werk-deployment"] for _ in range(6)]
    assert served.count("a1") == 3 and served.count("a2") == 3  # idle replicas alternate

    results: list[str] = []

    def one() -> None:
        results.append(env.chat("chat", "tell me something long " * 5)[1]["x-werk-deployment"])

    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(results) == {"a1", "a2"} and len(results) == 8


def test_control_header_selects_an_instance(env: Env) -> None:
    for deployment, model in (("a2", "model-a"), ("b", "model-b")):
        status, _, doc = env.call("GET", "/werk/v1/chat/limits", deployment=deployment)
        assert status == 200 and doc["data"]["model"] == model
        status, _, doc = env.call("GET", "/werk/v1/info", deployment=deployment)
        assert doc["data"]["active_backend"] == "llama.cpp"
    status, _, doc = env.call("GET", "/werk/v1/chat/limits", deployment="chat")
    assert status == 400 and doc["error"]["code"] == "invalid_request"
    status, _, doc = env.call("GET", "/werk/v1/info", deployment="nope")
    assert status == 404 and doc["error"]["code"] == "not_found"


def test_limits_of_an_alias_are_the_minimum_across_replicas(env: Env) -> None:
    status, _, doc = env.call("GET", "/werk/v1/chat/limits?model=chat")
    assert status == 200, doc
    limits = doc["data"]
    assert (limits["model"], limits["context_tokens"], limits["max_concurrent_requests"]) == ("chat", 1024, 1)
    status, _, doc = env.call("GET", "/werk/v1/chat/limits?model=a1")
    # two slots, one of them the state slot: one ordinary request at a time (werk_llamacpp.slots)
    assert (doc["data"]["context_tokens"], doc["data"]["max_concurrent_requests"]) == (2048, 1)
    count = {"model": "chat", "messages": [{"role": "user", "content": "count me"}]}
    status, _, doc = env.call("POST", "/werk/v1/chat/count_tokens", count)
    assert status == 200 and doc["data"]["model"] == "chat" and doc["data"]["input_tokens"] > 0


def test_lazy_start_happens_once_and_keep_alive_stops_it(env: Env) -> None:
    deadline = time.monotonic() + 20
    while env.inventory()["lazy"]["state"] != "cold":
        assert time.monotonic() < deadline, "the lazy instance never went cold"
        time.sleep(0.2)
    statuses: list[int] = []

    def first() -> None:
        statuses.append(env.chat("lazy")[0])

    threads = [threading.Thread(target=first) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert statuses == [200] * 16
    children = [
        p for p in psutil.Process().children(recursive=True) if p.name().startswith("llama-server") and p.is_running()
    ]
    assert len(children) == 4, [p.cmdline()[:3] for p in children]  # a1, a2, b and one lazy: started once
    lazy = env.inventory()["lazy"]
    pid = lazy["pid"] if lazy["state"] == "ready" else None
    deadline = time.monotonic() + 20
    while env.inventory()["lazy"]["state"] != "cold":
        assert time.monotonic() < deadline, "keep_alive never stopped the idle instance"
        time.sleep(0.2)
    if pid is not None:
        assert gone(pid, timeout=10)
    status, headers, _ = env.chat("lazy")
    assert (status, headers["x-werk-deployment"]) == (200, "lazy")  # the next use starts it again


def test_a_broken_model_fails_its_instance_only(env: Env) -> None:
    status, _, doc = env.chat("broken")
    assert status == 503 and doc["error"]["type"] in ("server_error", "service_unavailable", "unavailable_error")
    message = doc["error"]["message"]
    assert "broken" in message and "/" not in message and "gguf" not in message.lower()
    inventory = env.inventory()
    assert inventory["broken"]["state"] == "failed" and inventory["broken"]["error"]
    assert "/" not in inventory["broken"]["error"]
    assert env.chat("b")[0] == 200 and inventory["a1"]["state"] == "ready"
    status, _, doc = env.call("GET", "/werk/v1/capabilities", deployment="broken")
    caps = {c["id"]: c for c in doc["data"]}
    assert caps["runtime.model_residency"]["status"] == "unavailable"


def test_sigkill_of_one_child_expires_only_its_handoffs(env: Env) -> None:
    handoff_a = env.prefill("a1")
    handoff_b = env.prefill("b")
    pid = env.inventory()["a1"]["pid"]
    os.kill(pid, signal.SIGKILL)
    assert gone(pid, timeout=10)
    time.sleep(0.2)  # the kernel reports the exit to waitid() a moment after /proc shows it
    assert env.decode("a1", handoff_a) == 410
    assert env.decode("b", handoff_b) == 200
    status, headers, _ = env.chat("a1")
    assert (status, headers["x-werk-deployment"]) == (200, "a1")
    assert env.inventory()["a1"]["pid"] not in (None, pid)  # restarted
    assert env.decode("b", env.prefill("b")) == 200


def test_a_handoff_decoded_against_another_instance_is_expired(env: Env) -> None:
    handoff = env.prefill("a1")
    assert env.decode("a2", handoff) == 410

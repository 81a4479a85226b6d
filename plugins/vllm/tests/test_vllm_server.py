"""A real Werk-started vLLM (tiny generated Llama, CPU): statuses, the OpenAI SDK, exact token
counts, prefix-cache hits, cancellation, the conformance suite, a deployment whose bad instances
fail alone, and a replaced process.

One ``vllm serve`` serves the whole module: the host of :func:`env` starts it with
``--persistence`` (so Werk adds ``--enable-prefix-caching``); the conformance host and the
deployment's ``local`` instance reach the very same effective argv and therefore share that
process instead of starting their own (one process per launch key). Only the last test starts a
second one, after killing the first. The deployment's ``broken`` instance spawns a vLLM that
fails while loading its model.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import psutil  # type: ignore[import-untyped]
import pytest
from prometheus_client.parser import text_string_to_metric_families
from vllm_helpers import FAKE_VLLM, model_manifest, records
from werk_vllm import plugin
from werk_vllm import server as servers
from werk_vllm.adapter import VllmAdapter, create_adapter
from werk_vllm.apc import APC_ON
from werk_vllm.client import get
from werk_vllm.launch import OPTION_FLAGS

from werk_host.plugin import Adapter, ErrorCode, HostConfig, ModelManifest, PersistenceDefaults, WerkError
from werk_host.plugin.process import free_port
from werk_host.testing.api import Api
from werk_host.testing.conformance import ConformanceHost, ConformanceTarget, WerkConformance
from werk_host.testing.host import Host, ModelRegistry, PluginHost, build_host
from werk_host.testing.hosts import running
from werk_host.testing.processes import gone

pytestmark = pytest.mark.vllm

KEY = "sk-werk-vllm-test-4471"
OPTIONS: dict[str, Any] = {"gpu_memory_utilization": 0.1, "max_model_len": 2048, "max_num_seqs": 4}
UNSUPPORTED = (
    "runtime.state.persistence",
    "runtime.state.restore",
    "runtime.state.restore.cross_restart",
    "runtime.state.tier.disk",
    "runtime.state.tier.ram",
    "runtime.state.tier.vram",
    "runtime.pd.prefill",
    "runtime.pd.decode",
    "runtime.pd.handoff",
    "runtime.experts.residency",
)


@dataclass
class Env:
    url: str
    host: Host
    home: Path
    api: Api
    manifest: ModelManifest
    options: dict[str, Any]
    sdk: openai.OpenAI

    @property
    def adapter(self) -> VllmAdapter:
        adapter = self.host.fleet.adapter
        assert isinstance(adapter, VllmAdapter)
        return adapter

    def capabilities(self, api: Api | None = None) -> dict[str, dict[str, Any]]:
        status, doc = (api or self.api).get("/werk/v1/capabilities")
        assert status == 200, doc
        return {c["id"]: c for c in doc["data"]}

    def raw_metrics(self) -> dict[str, float]:
        live = self.adapter.live()
        assert live is not None
        answer = get(live.pool, "/metrics")
        assert answer is not None and answer[0] == 200
        out: dict[str, float] = {}
        for family in text_string_to_metric_families(answer[1].decode()):
            for sample in family.samples:
                label = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()) if k == "finished_reason")
                name = f"{sample.name}{{{label}}}" if label else sample.name
                out[name] = out.get(name, 0.0) + sample.value
        return out


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, vllm_executable: Path, tiny_hf_model: Path) -> Iterator[Env]:
    home = tmp_path_factory.mktemp("vllm-server") / "home"
    home.mkdir()
    manifest = model_manifest(tiny_hf_model)
    ModelRegistry(home).add(manifest)
    plugins = PluginHost()
    plugins.register(plugin, "vllm")
    options = {"executable": str(vllm_executable), **OPTIONS}
    config = HostConfig(
        home=home,
        api_keys=(KEY,),
        model=manifest.name,
        persistence=PersistenceDefaults(),
        backend_options={"vllm": options},
    )
    started = time.monotonic()
    host = build_host(config, plugins=plugins)
    print(f"\n[werk-vllm] vllm serve became healthy in {time.monotonic() - started:.0f}s")
    with running(host) as url:
        sdk = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=120)
        yield Env(url, host, home, Api(url, KEY, timeout=300), manifest, options, sdk)
    assert not servers.shared_servers(), "the shared vLLM server outlived its adapters"


# -- statuses -------------------------------------------------------------------------------------


def test_persistence_turns_on_prefix_caching_and_statuses_follow(env: Env) -> None:
    caps = env.capabilities()
    assert caps["runtime.state.prefix_cache"]["status"] == "externally_managed"
    assert caps["runtime.state.prefix_cache"]["operations"] == ["automatic_reuse"]
    assert caps["runtime.model_residency"]["status"] == "supported"
    for cap_id in ("api.chat.token_count", "api.chat.admission", "api.chat.limits", "api.chat.reasoning"):
        assert caps[cap_id]["status"] == "supported", cap_id
    assert caps["runtime.placement"]["status"] == "supported"
    for cap_id in UNSUPPORTED:
        assert caps[cap_id]["status"] == "unsupported", cap_id
    argv = env.adapter.effective_argv()
    assert argv is not None and argv.count(APC_ON) == 1 and "--no-enable-prefix-caching" not in argv


def test_plan_limits_and_reasoning(env: Env) -> None:
    status, doc = env.api.get("/werk/v1/deployments")
    assert status == 200, doc
    (plan,) = [p["plan"] for p in doc["data"]["plans"]]
    assert plan["endpoint"] == "local" and plan["device"] == "cpu"  # the installed vLLM is a +cpu build
    assert (plan["parallel_slots"], plan["context_per_slot"]) == (4, 2048)
    assert plan["arguments"][:2] == ["serve", "<path>"] and APC_ON in plan["arguments"]
    assert not any(a.startswith("/") for a in plan["arguments"])
    (inventory,) = doc["data"]["inventory"]
    assert inventory["pid"] == env.adapter.live().pid  # type: ignore[union-attr]
    status, doc = env.api.get("/werk/v1/chat/limits")
    assert status == 200, doc
    limits = doc["data"]
    assert (limits["context_tokens"], limits["max_output_tokens"], limits["max_concurrent_requests"]) == (2048, 2047, 4)
    status, doc = env.api.get("/werk/v1/chat/reasoning", max_output_tokens=64)
    assert status == 200 and doc["data"]["supported"] is False and doc["data"]["tiers"] == []


# -- inference through the OpenAI SDK -------------------------------------------------------------------


def test_chat_completions_and_streaming_through_the_openai_sdk(env: Env) -> None:
    chat = env.sdk.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Say hello."}], max_tokens=4, temperature=0
    )
    assert chat.model == "tiny" and chat.choices[0].message.role == "assistant"
    assert chat.usage is not None and chat.usage.completion_tokens == 4
    text = env.sdk.completions.create(model="tiny", prompt="Once upon a time", max_tokens=3, temperature=0)
    assert text.usage is not None and text.usage.completion_tokens == 3 and isinstance(text.choices[0].text, str)
    stream = env.sdk.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Count to three."}],
        max_tokens=5,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = [c.usage for c in chunks if c.usage is not None]
    assert len(chunks) >= 3 and usage and usage[0].completion_tokens == 5
    assert isinstance(content, str)
    again = env.sdk.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Count to three."}], max_tokens=5, temperature=0
    )
    assert again.choices[0].message.content == content  # greedy: the stream carried the same text


#: ``max_tokens`` of the abandoned stream: as long an answer as the context allows.
LONG_ANSWER = 2000
#: How long an engine still generating when its client left may take to stop.
CANCEL_GRACE_S = 1.0
#: Abandoned streams tried before the test gives up on a CPU too starved to show anything.
ATTEMPTS = 4


def _abandon_a_long_stream(env: Env) -> tuple[float, float, float]:
    """Stream a long completion through the host and leave after its first bytes. Returns the
    tokens vLLM generated, the seconds until those first bytes, and vLLM's own end-to-end
    seconds for the request (0 when it did not record it as finished)."""
    before = env.raw_metrics()
    port = int(env.url.rsplit(":", 1)[1])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    body = {"prompt": "Once upon a time", "max_tokens": LONG_ANSWER, "stream": True, "ignore_eos": True}
    started = time.monotonic()
    conn.request(
        "POST",
        "/v1/completions",
        body=json.dumps(body),
        headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
    )
    sock = conn.sock
    assert sock is not None
    response = conn.getresponse()
    assert response.status == 200
    assert response.read1(4096).startswith(b"data: ")
    first_bytes = time.monotonic() - started
    sock.shutdown(socket.SHUT_RDWR)  # the client goes away mid-stream
    sock.close()
    conn.close()
    deadline = time.monotonic() + 30
    time.sleep(0.5)
    while env.raw_metrics()["vllm:num_requests_running"] > 0:
        assert time.monotonic() < deadline, "the abandoned request kept running"
        time.sleep(0.1)
    after = env.raw_metrics()
    generated = after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
    latency = "vllm:e2e_request_latency_seconds_sum"
    return generated, first_bytes, after.get(latency, 0.0) - before.get(latency, 0.0)


def test_a_client_disconnect_cancels_the_upstream_generation(env: Env) -> None:
    # When vLLM's API server is starved of CPU (other processes busy on this 2-core machine), it
    # sends the first event only once the engine has generated the whole answer (measured: 3 s
    # of silence, then all 2000 events at once, straight from vLLM as through the host). Such a
    # run cannot show a cancellation, which it tells by vLLM's own time for the request being
    # no longer than the client's wait for its first bytes; it is tried again. A run whose
    # engine was still generating when the client left must stop early.
    starved: list[tuple[float, float]] = []
    for _ in range(ATTEMPTS):
        generated, first_bytes, engine_s = _abandon_a_long_stream(env)
        if 1 <= generated < LONG_ANSWER:
            return  # vLLM stopped early: the host closed its upstream request
        assert generated == LONG_ANSWER, generated
        assert engine_s <= first_bytes + CANCEL_GRACE_S, (
            f"vLLM generated for {engine_s:.1f} s, to the end, after a client that left at {first_bytes:.1f} s"
        )
        starved.append((round(first_bytes, 1), round(engine_s, 1)))
    pytest.skip(f"vLLM sent its first event only after generating the whole answer, {ATTEMPTS} times: {starved}")


# -- exact counts and the prefix cache --------------------------------------------------------------------

CONVERSATIONS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "Hello there"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "And of Italy?"},
    ],
    [{"role": "user", "content": "Grüße aus Köln 🌍 — naïve café, 東京"}],
    [{"role": "user", "content": [{"type": "text", "text": "part one"}, {"type": "text", "text": "part two"}]}],
]


@pytest.mark.parametrize("messages", CONVERSATIONS, ids=["short", "multi-turn", "unicode", "text-parts"])
def test_count_tokens_equals_the_prompt_tokens_vllm_reports(env: Env, messages: list[dict[str, Any]]) -> None:
    status, doc = env.api.call("POST", "/werk/v1/chat/count_tokens", {"model": "tiny", "messages": messages})
    assert status == 200, doc
    counted = doc["data"]["input_tokens"]
    status, doc = env.api.call("POST", "/werk/v1/chat/admission", {"messages": messages, "max_tokens": 8})
    assert status == 200 and doc["data"]["token_count_method"] == "native"
    assert doc["data"]["input_tokens"] == counted and doc["data"]["context_tokens"] == 2048
    chat = env.sdk.chat.completions.create(model="tiny", messages=messages, max_tokens=1)  # type: ignore[arg-type]
    assert chat.usage is not None and chat.usage.prompt_tokens == counted


def test_a_repeated_prompt_hits_the_prefix_cache(env: Env) -> None:
    before = env.adapter.metrics(env.adapter.live())  # type: ignore[arg-type]
    # Unique, and over two of vLLM's 128-token CPU blocks: the first pass fills, the second hits.
    prompt = f"{secrets.token_hex(6)} " + "The quick brown fox jumps over the lazy dog. " * 30
    for _ in range(2):
        done = env.sdk.completions.create(model="tiny", prompt=prompt, max_tokens=2)
        assert done.usage is not None and 256 < done.usage.prompt_tokens < 500
    after = env.adapter.metrics(env.adapter.live())  # type: ignore[arg-type]
    assert after.prefix_cache_hits is not None and after.prefix_cache_hits >= (before.prefix_cache_hits or 0) + 256
    status, doc = env.api.get("/werk/v1/observability")
    assert status == 200, doc
    (worker,) = doc["data"]["workers"]
    assert worker["backend"] == "vllm" and worker["pid"] == env.adapter.live().pid  # type: ignore[union-attr]
    assert worker["prefix_cache_hit_rate"] is not None and worker["prefix_cache_hit_rate"] > 0
    assert (worker["requests_running"], worker["requests_waiting"]) == (0, 0)
    assert worker["kv_cache_usage"] is not None and 0 <= worker["kv_cache_usage"] <= 1
    assert (worker["slots"], worker["context_per_request_tokens"]) == (4, 2048)
    assert worker["context_capacity_tokens"] is not None and worker["context_capacity_tokens"] > 2048


# -- the conformance suite, on the same process ---------------------------------------------------------------


def kill_child(adapter: Adapter) -> None:
    """Replace the backend process the hard way: SIGKILL the live ``vllm serve``."""
    assert isinstance(adapter, VllmAdapter)
    live = adapter.live()
    assert live is not None and live.pid is not None
    os.kill(live.pid, signal.SIGKILL)
    assert gone(live.pid, timeout=10)
    deadline = time.monotonic() + 10  # /proc shows the zombie a moment before waitid() reports it
    while adapter.live() is not None and time.monotonic() < deadline:
        time.sleep(0.01)


class TestConformance(WerkConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def conformance_target(cls, env: Env) -> Iterator[ConformanceTarget]:
        # The suite's host has no --persistence; WERK_VLLM_ARGS=--enable-prefix-caching gives its
        # adapter the very argv the env host's injection produced, so it shares that process.
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("WERK_VLLM_ARGS", APC_ON)
            yield ConformanceTarget(
                plugin=plugin,
                plugin_name="vllm",
                model=env.manifest,
                model_name=env.manifest.name,
                replace_process=kill_child,
                backend_options={"vllm": dict(env.options)},
            )

    def test_the_suite_shares_the_running_process(self, conformance_host: ConformanceHost, env: Env) -> None:
        adapter = conformance_host.adapter
        assert isinstance(adapter, VllmAdapter)
        live, anchor = adapter.live(), env.adapter.live()
        assert live is not None and anchor is not None and live.pid == anchor.pid
        assert adapter.target.server is env.adapter.target.server  # type: ignore[union-attr]
        assert adapter.target.server.starts == 1  # type: ignore[union-attr]


# -- a flag this vLLM lacks -------------------------------------------------------------------------------------


def test_a_generated_flag_the_installed_vllm_lacks_is_refused(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(OPTION_FLAGS, "max_num_seqs", "--max-num-seqs-per-engine")  # as a future plugin might
    held = servers.shared_servers()
    config = HostConfig(home=env.home, backend_options={"vllm": {**env.options, "max_num_seqs": 2}})
    with pytest.raises(WerkError) as err:
        create_adapter(config, env.manifest)
    assert err.value.code is ErrorCode.UNAVAILABLE and not err.value.retryable
    assert "--max-num-seqs-per-engine" in err.value.message and "0.32" in err.value.message
    assert servers.shared_servers() == held  # nothing was acquired, nothing spawned


# -- a deployment: one good instance, each bad one failing alone ----------------------------------------------------

PROFILE = """
[[instance]]
id = "local"
model = "tiny"
backend = "vllm"
options = {{ gpu_memory_utilization = 0.1, max_model_len = 2048, max_num_seqs = 4 }}
preload = true
default = true

[[instance]]
id = "no-vllm"
model = "tiny"
backend = "vllm"
options = {{ executable = "{missing}" }}

[[instance]]
id = "old-vllm"
model = "tiny"
backend = "vllm"
options = {{ executable = "{fake}", max_num_seqs = 4 }}

[[instance]]
id = "gone"
model = "tiny"
backend = "vllm"
endpoint = "http://127.0.0.1:{closed}"

[[instance]]
id = "broken"
model = "broken"
backend = "vllm"
options = {{ gpu_memory_utilization = 0.1, max_model_len = 512, startup_timeout = 240 }}
"""


@dataclass
class Deployment:
    api: Api
    host: Host
    records: Path


@pytest.fixture(scope="module")
def deployment(
    env: Env, tmp_path_factory: pytest.TempPathFactory, tiny_hf_model: Path, vllm_executable: Path
) -> Iterator[Deployment]:
    root = tmp_path_factory.mktemp("vllm-deployment")
    home = root / "home"
    home.mkdir()
    registry = ModelRegistry(home)
    registry.add(env.manifest)
    broken = root / "broken-model"
    shutil.copytree(tiny_hf_model, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(os.urandom(weights.stat().st_size))  # the right size, nothing vLLM can load
    registry.add(model_manifest(broken, "broken"))
    fake = root / "old" / "vllm"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE_VLLM}" "$@"\n')
    fake.chmod(0o755)
    fake_records = root / "records"
    fake_records.mkdir()
    profile = root / "deployments.toml"
    profile.write_text(PROFILE.format(missing=root / "nowhere" / "vllm", fake=fake, closed=free_port()))
    plugins = PluginHost()
    plugins.register(plugin, "vllm")
    config = HostConfig(
        home=home,
        api_keys=(KEY,),
        profile=profile,
        persistence=PersistenceDefaults(),
        backend_options={"vllm": {"executable": str(vllm_executable)}},
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FAKE_VLLM_DROP", "--max-num-seqs")  # an "old" vLLM without that option
        patch.setenv("FAKE_VLLM_VERSION", "0.1.0")
        patch.setenv("FAKE_VLLM_RECORD", str(fake_records))
        host = build_host(config, plugins=plugins)
        with running(host) as url:
            yield Deployment(Api(url, KEY, timeout=300), host, fake_records)


def chat(api: Api, model: str) -> tuple[int, dict[str, Any]]:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    return api.call("POST", "/v1/chat/completions", body)


@pytest.mark.parametrize(
    "instance, logged",
    [
        ("no-vllm", "vLLM is not installed here"),
        ("old-vllm", "has no --max-num-seqs option"),
        ("gone", "is not answering"),
        ("broken", "exited with status"),
    ],
)
def test_a_bad_instance_fails_alone_with_a_typed_error(
    deployment: Deployment, env: Env, caplog: pytest.LogCaptureFixture, instance: str, logged: str
) -> None:
    inventory = {i["id"]: i for i in deployment.api.get("/werk/v1/deployments")[1]["data"]["inventory"]}
    assert inventory["local"]["state"] == "ready"
    assert inventory["local"]["pid"] == env.adapter.live().pid  # type: ignore[union-attr]  # shared, not started again
    with caplog.at_level(logging.ERROR):
        status, doc = chat(deployment.api, instance)
    assert status == 503, doc
    assert doc["error"]["type"] in ("server_error", "service_unavailable", "unavailable_error")
    message = doc["error"]["message"]
    assert instance in message and "/" not in message and KEY not in message
    assert logged in caplog.text  # the typed plugin error, in the server log
    inventory = {i["id"]: i for i in deployment.api.get("/werk/v1/deployments")[1]["data"]["inventory"]}
    assert inventory[instance]["state"] == "failed" and "/" not in inventory[instance]["error"]
    caps = {c["id"]: c for c in instance_capabilities(deployment, instance)}
    assert caps["runtime.model_residency"]["status"] == "unavailable"
    assert chat(deployment.api, "local")[0] == 200  # the rest of the host keeps serving
    if instance == "old-vllm":
        assert records(deployment.records, "inspect") and not records(deployment.records, "spawn")
    engines = [p for p in psutil.Process().children(recursive=True) if p.name().startswith("VLLM::EngineCore")]
    assert len(engines) == 1, engines  # the shared server's; a failed start leaves nothing behind


def instance_capabilities(deployment: Deployment, instance: str) -> list[dict[str, Any]]:
    conn = http.client.HTTPConnection(deployment.api.host, deployment.api.port, timeout=60)
    try:
        headers = {"Authorization": f"Bearer {KEY}", "X-Werk-Deployment": instance}
        conn.request("GET", "/werk/v1/capabilities", headers=headers)
        doc = json.loads(conn.getresponse().read())
    finally:
        conn.close()
    data: list[dict[str, Any]] = doc["data"]
    return data


# -- last: a replaced process ---------------------------------------------------------------------------------------


def test_a_killed_process_changes_identity_and_the_next_request_replaces_it(env: Env) -> None:
    adapter = env.adapter
    before, live = adapter.identity(), adapter.live()
    assert live is not None and live.pid is not None
    kill_child(adapter)
    assert adapter.identity() != before
    caps = env.capabilities()
    assert caps["runtime.model_residency"]["status"] == "unavailable"
    assert caps["runtime.state.prefix_cache"]["status"] == "unavailable"
    assert caps["api.chat.token_count"]["status"] == "unavailable"
    started = time.monotonic()
    status, doc = chat(env.api, "tiny")  # starts a new generation
    assert status == 200, doc
    print(f"\n[werk-vllm] the replacement became healthy in {time.monotonic() - started:.0f}s")
    after = adapter.live()
    assert after is not None and after.pid != live.pid and after.generation != live.generation
    assert adapter.identity() not in (before, f"{adapter.instance_id}#none")
    assert gone(live.pid, timeout=1)
    assert env.capabilities()["runtime.state.prefix_cache"]["status"] == "externally_managed"

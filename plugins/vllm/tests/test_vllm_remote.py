"""Remote mode against a real ``vllm serve`` that this module starts itself (as another machine
would run it, with its own API key), served through a Werk deployment instance with ``endpoint``
and ``api_key_env``."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import psutil  # type: ignore[import-untyped]
import pytest
from werk_vllm import plugin
from werk_vllm.adapter import VllmAdapter

from werk_host.plugin import HostConfig
from werk_host.plugin.process import free_port, http_ready
from werk_host.testing.api import Api
from werk_host.testing.host import Host, PluginHost, build_host
from werk_host.testing.hosts import running

pytestmark = pytest.mark.vllm

KEY = "sk-werk-vllm-remote-test-6102"
REMOTE_KEY = "sk-the-remote-vllm-key-0b7e55"
KEY_ENV = "WERK_TEST_REMOTE_VLLM_KEY"
SERVED = "big-tiny"

PROFILE = """
[[instance]]
id = "remote"
model = "{served}"
backend = "vllm"
endpoint = "http://127.0.0.1:{port}"
api_key_env = "{key_env}"
preload = true
default = true
"""


@dataclass
class Remote:
    url: str
    port: int
    proc: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        """SIGTERM the server's process group, SIGKILL what is left, and make sure all of it is gone."""
        if self.proc.poll() is None:
            group = [p for p in psutil.process_iter() if _pgid(p) == self.proc.pid]
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
            _, alive = psutil.wait_procs(group, timeout=30)
            for leftover in alive:
                leftover.kill()
            assert not alive, f"vllm serve left {alive}"


def _pgid(proc: psutil.Process) -> int | None:
    try:
        return os.getpgid(proc.pid)
    except OSError:
        return None


@pytest.fixture(scope="module")
def remote(tmp_path_factory: pytest.TempPathFactory, vllm_executable: Path, tiny_hf_model: Path) -> Iterator[Remote]:
    port = free_port()
    log = tmp_path_factory.mktemp("remote-vllm") / "vllm.log"
    env = {**os.environ, "VLLM_API_KEY": REMOTE_KEY, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    argv = [
        str(vllm_executable),
        "serve",
        str(tiny_hf_model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--served-model-name",
        SERVED,
        "--gpu-memory-utilization",
        "0.1",
        "--max-model-len",
        "512",
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    server = Remote(f"http://127.0.0.1:{port}", port, proc, log)
    try:
        ready = http_ready("127.0.0.1", port, "/health")
        started = time.monotonic()
        while not ready():
            if proc.poll() is not None:
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
                pytest.fail(f"the remote vllm serve exited with {proc.returncode}:\n{tail}")
            assert time.monotonic() - started < 600, "the remote vllm serve never became healthy"
            time.sleep(0.5)
        print(f"\n[werk-vllm] the remote vllm serve became healthy in {time.monotonic() - started:.0f}s")
        yield server
    finally:
        server.stop()


@dataclass
class Env:
    api: Api
    host: Host
    sdk: openai.OpenAI

    @property
    def adapter(self) -> VllmAdapter:
        adapter = self.host.fleet.adapter
        assert isinstance(adapter, VllmAdapter)
        return adapter

    def capabilities(self) -> dict[str, dict[str, Any]]:
        status, doc = self.api.get("/werk/v1/capabilities")
        assert status == 200, doc
        return {c["id"]: c for c in doc["data"]}


@pytest.fixture(scope="module")
def env(remote: Remote, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root = tmp_path_factory.mktemp("remote-werk")
    home = root / "home"
    home.mkdir()
    profile = root / "deployments.toml"
    profile.write_text(PROFILE.format(served=SERVED, port=remote.port, key_env=KEY_ENV))
    plugins = PluginHost()
    plugins.register(plugin, "vllm")
    # Server-wide launch options do not apply to a remote instance: nothing is launched.
    config = HostConfig(
        home=home, api_keys=(KEY,), profile=profile, backend_options={"vllm": {"gpu_memory_utilization": 0.1}}
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(KEY_ENV, REMOTE_KEY)
        host = build_host(config, plugins=plugins)  # the key is read here, when the adapter is made
    with running(host) as url:
        sdk = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=120)
        yield Env(Api(url, KEY, timeout=120), host, sdk)


def test_remote_statuses_inventory_and_plan(env: Env) -> None:
    caps = env.capabilities()
    assert caps["runtime.model_residency"]["status"] == "externally_managed"
    assert caps["runtime.state.prefix_cache"]["status"] == "metadata_only"
    for cap_id in ("api.chat.token_count", "api.chat.admission", "api.chat.limits", "runtime.placement"):
        assert caps[cap_id]["status"] == "supported", cap_id
    assert caps["runtime.pd.prefill"]["status"] == "unsupported"
    status, doc = env.api.get("/werk/v1/deployments")
    assert status == 200, doc
    (inventory,) = doc["data"]["inventory"]
    assert (inventory["endpoint"], inventory["pid"], inventory["state"]) == ("remote", None, "ready")
    (plan,) = [p["plan"] for p in doc["data"]["plans"]]
    assert plan == {
        "endpoint": "remote",
        "arguments": [],
        "threads": None,
        "parallel_slots": None,
        "context_per_slot": 512,
        "device": None,
    }
    status, doc = env.api.get("/werk/v1/chat/limits")
    assert (doc["data"]["context_tokens"], doc["data"]["max_concurrent_requests"]) == (512, None)
    assert env.adapter.identity() == env.adapter.identity()


def test_remote_inference_through_the_openai_sdk(env: Env) -> None:
    chat = env.sdk.chat.completions.create(
        model="remote", messages=[{"role": "user", "content": "Say hello."}], max_tokens=3, temperature=0
    )
    # Answers name the model as the client asked for it, not the upstream's served name.
    assert chat.model == "remote" and chat.usage is not None and chat.usage.completion_tokens == 3
    text = env.sdk.completions.create(model=SERVED, prompt="Once upon a time", max_tokens=2)
    assert text.model == SERVED and text.usage is not None and text.usage.completion_tokens == 2
    stream = env.sdk.chat.completions.create(
        model="remote", messages=[{"role": "user", "content": "Count."}], max_tokens=4, stream=True
    )
    assert len([c for c in stream if c.choices]) >= 2


def test_remote_count_tokens_is_exact_and_hits_are_observed(env: Env) -> None:
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is the capital of France? " * 20},
    ]
    status, doc = env.api.call("POST", "/werk/v1/chat/count_tokens", {"model": "remote", "messages": messages})
    assert status == 200, doc
    counted = doc["data"]["input_tokens"]
    for _ in range(2):
        chat = env.sdk.chat.completions.create(model="remote", messages=messages, max_tokens=1)  # type: ignore[arg-type]
        assert chat.usage is not None and chat.usage.prompt_tokens == counted
    status, doc = env.api.get("/werk/v1/observability")
    (worker,) = doc["data"]["workers"]
    assert worker["pid"] is None and worker["backend"] == "vllm"
    assert worker["prefix_cache_hit_rate"] is not None and worker["prefix_cache_hit_rate"] > 0


def test_the_remote_key_never_leaves(env: Env, remote: Remote, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG):
        seen = [
            env.api.get("/werk/v1/deployments"),
            env.api.get("/werk/v1/capabilities"),
            env.api.get("/werk/v1/info"),
            env.api.get("/werk/v1/observability"),
            env.api.call("POST", "/v1/chat/completions", {"model": "remote", "messages": [], "max_tokens": 1}),
            env.api.call("POST", "/werk/v1/chat/count_tokens", {"model": "nope", "messages": [{"role": "user"}]}),
        ]
    assert seen[4][0] >= 400  # vLLM refused an empty conversation; Werk relays a sanitized error
    for _, doc in seen:
        assert REMOTE_KEY not in str(doc)
    assert REMOTE_KEY not in caplog.text
    assert REMOTE_KEY not in repr(env.adapter.target) and REMOTE_KEY not in repr(env.host.config)
    assert "Unauthorized" not in remote.log.read_text(errors="replace")  # every request carried the key


def test_a_remote_that_goes_away_is_unavailable_on_its_instance(env: Env, remote: Remote) -> None:
    remote.stop()
    time.sleep(2.5)  # past the reachability cache
    caps = env.capabilities()
    assert caps["runtime.model_residency"]["status"] == "unavailable"
    assert caps["api.chat.token_count"]["status"] == "unavailable"
    status, doc = env.api.call(
        "POST", "/v1/chat/completions", {"model": "remote", "messages": [{"role": "user", "content": "hi"}]}
    )
    assert status == 503 and doc["error"]["type"] in ("server_error", "service_unavailable", "unavailable_error"), doc
    status, doc = env.api.call("POST", "/werk/v1/chat/count_tokens", {"messages": [{"role": "user", "content": "hi"}]})
    assert status == 503, doc
    status, doc = env.api.get("/werk/v1/deployments")
    assert doc["data"]["plans"][0]["plan"] is None

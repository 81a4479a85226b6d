"""werk-llamacpp end to end: a real llama-server behind a real Werk host over HTTP."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from werk_llamacpp.adapter import LlamaCppAdapter

from werk_host.plugin import HostConfig, ModelManifest
from werk_host.testing.api import Api
from werk_host.testing.host import Host, ModelRegistry, build_host
from werk_host.testing.hosts import running
from werk_host.testing.markers import covers_hooks

pytestmark = pytest.mark.llamaserver
KEY = "sk-werk-llama-test-123456"
PROMPT = "Werk keeps a reusable prefix: " + " ".join(f"word{i}" for i in range(60))


@dataclass
class Env:
    host: Host
    api: Api

    @property
    def adapter(self) -> LlamaCppAdapter:
        adapter = self.host.fleet.adapter
        assert isinstance(adapter, LlamaCppAdapter)
        return adapter

    def prefill(self, text: str = PROMPT, **extra: Any) -> tuple[int, dict[str, Any]]:
        body = {"model_id": "tiny", "input": {"type": "text", "text": text}, "allow_experimental": True, **extra}
        return self.api.post("/werk/v1/prefill", body)

    def decode(self, handoff: str, **extra: Any) -> tuple[int, dict[str, Any]]:
        return self.api.post(
            "/werk/v1/decode", {"handoff": handoff, "allow_experimental": True, "max_tokens": 4, **extra}
        )

    def caps(self) -> dict[str, dict[str, Any]]:
        status, body = self.api.get("/werk/v1/capabilities")
        assert status == 200
        return {c["id"]: c for c in body["data"]}


def install(home: Path, model: Path) -> None:
    ModelRegistry(home).add(
        ModelManifest.from_paths("tiny", [model], backend="llama.cpp", params={"max_output_tokens": 256})
    )


def config(home: Path, server: Path) -> HostConfig:
    return HostConfig(
        home=home,
        api_keys=(KEY,),
        model="tiny",
        backend_options={"llamacpp": {"llama_server": str(server), "parallel": 2, "ctx": 4096}},
    )


@pytest.fixture
def env(tmp_path: Path, llama_server_path: Path, tiny_model: Path) -> Iterator[Env]:
    home = tmp_path / "home"
    home.mkdir()
    install(home, tiny_model)
    host = build_host(config(home, llama_server_path))
    with running(host) as base:
        yield Env(host, Api(base, KEY))


def ok(result: tuple[int, dict[str, Any]]) -> dict[str, Any]:
    status, body = result
    assert status == 200, body
    data: dict[str, Any] = body["data"]
    return data


@covers_hooks(
    "werk_adapter_factories",
    "werk_capabilities",
    "werk_prefill",
    "werk_snapshot",
    "werk_decode",
    "werk_compat_key",
)
def test_probe_gates_capabilities_then_prefill_decode_works(env: Env) -> None:
    caps = env.caps()
    assert caps["runtime.model_residency"]["status"] == "supported"
    assert caps["runtime.pd.prefill"]["status"] == "unavailable"  # before the probe
    assert caps["runtime.state.tier.ram"]["status"] == "unsupported"
    assert caps["runtime.state.restore.cross_restart"]["status"] == "unavailable"
    status, body = env.api.post("/werk/v1/prefill", {"model_id": "tiny", "input": {"type": "text", "text": "hi"}})
    assert (status, body["error"]["code"]) == (503, "unavailable")  # not opted in: no probe, no work

    data = ok(env.prefill())
    assert data["state_id"].startswith("st_") and data["tier"] == "disk" and data["reused"] is False
    assert data["prompt_tokens"] > 60
    probe = env.adapter.probe_result()
    assert probe is not None and probe.passed, probe
    assert probe.evidence["restore"]["n_restored"] == probe.evidence["save"]["n_saved"]
    assert probe.evidence["replay"]["prompt_n"] <= 1
    caps = env.caps()
    for cap in ("runtime.pd.prefill", "runtime.pd.decode", "runtime.state.persistence", "runtime.state.tier.disk"):
        assert caps[cap]["status"] == "experimental"
    status, body = env.api.post("/werk/v1/prefill", {"model_id": "tiny", "input": {"type": "text", "text": "hi"}})
    assert (status, body["error"]["code"]) == (428, "experimental_opt_in_required")

    out = ok(env.decode(data["handoff"]))
    assert out["finish_reason"] in ("stop", "length") and 0 < out["completion_tokens"] <= 4
    assert isinstance(out["text"], str) and out["handoff"] is None
    assert env.decode(data["handoff"])[0] == 410  # single use


@covers_hooks("werk_restore")
def test_reuse_restores_from_disk_without_recomputing(env: Env) -> None:
    first = ok(env.prefill())
    ok(env.decode(first["handoff"]))  # the slot now holds other tokens too
    second = ok(env.prefill())
    assert second["reused"] is True and second["state_id"] == first["state_id"]
    ok(env.decode(second["handoff"]))
    evidence = env.adapter.last_decode
    assert evidence["restored"] is True
    # llama-server's own counters: only the last prompt token was evaluated again
    assert evidence["cache_n"] == evidence["prompt_tokens"] - 1
    assert evidence["prompt_n"] == 1


def test_messages_are_rendered_with_the_model_template(env: Env) -> None:
    body = {
        "model_id": "tiny",
        "input": {
            "type": "messages",
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        },
        "policy": {"mode": "ephemeral"},
        "allow_experimental": True,
    }
    data = ok(env.api.post("/werk/v1/prefill", body))
    assert data["state_id"] is None
    proc = env.adapter.current()
    assert proc is not None and proc.client is not None
    text = proc.client.apply_template([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert data["prompt_tokens"] == len(proc.client.tokenize(text, add_special=True, parse_special=True))
    ok(env.decode(data["handoff"]))


def _flip_snapshot_byte(env: Env, state_id: str) -> None:
    """Invert one byte in the middle of the stored snapshot, in place (same inode and size)."""
    (payload,) = list(env.host.config.home.glob(f"runtime-state/v1/p_*/{state_id}/payload.bin"))
    size = payload.stat().st_size
    with open(payload, "r+b") as f:
        f.seek(size // 2)
        byte = f.read(1)
        f.seek(size // 2)
        f.write(bytes([byte[0] ^ 0xFF]))


def _listed(env: Env) -> set[str]:
    return {s["id"] for s in ok(env.api.get("/werk/v1/states"))["states"]}


def test_flipped_snapshot_byte_is_never_reused(env: Env) -> None:
    data = ok(env.prefill())
    ok(env.decode(data["handoff"]))
    _flip_snapshot_byte(env, data["state_id"])
    status, body = env.prefill(policy={"reuse": "required"})
    assert (status, body["error"]["code"]) == (409, "conflict")
    assert body["error"]["details"] == {"reason": "corrupt_state"}
    assert _listed(env) == set()  # quarantined, not offered again
    again = ok(env.prefill())  # prefer: a fresh prefill and a fresh snapshot
    assert again["reused"] is False and again["state_id"] != data["state_id"]
    out = ok(env.decode(again["handoff"]))
    assert 0 < out["completion_tokens"] <= 4
    reused = ok(env.prefill())
    assert reused["reused"] is True and reused["state_id"] == again["state_id"]
    ok(env.decode(reused["handoff"]))
    assert env.adapter.last_decode["restored"] is True  # from the new, intact snapshot


def test_flipped_byte_after_prefill_fails_decode_as_corrupt_state(env: Env) -> None:
    """A handoff issued before the damage still meets the decode-time SHA-256 check."""
    data = ok(env.prefill())
    ok(env.decode(data["handoff"]))
    handoff = ok(env.prefill())["handoff"]  # reused, verified intact
    _flip_snapshot_byte(env, data["state_id"])
    status, body = env.decode(handoff)
    assert (status, body["error"]["code"]) == (500, "corrupt_state")
    assert body["error"]["message"] == "stored state failed integrity validation"


def test_killed_llama_server_gives_typed_error_and_a_fresh_child(env: Env) -> None:
    data = ok(env.prefill())
    before = ok(env.api.get("/werk/v1/states"))["states"]
    proc = env.adapter.current()
    assert proc is not None and proc.pid is not None
    old_generation = proc.generation

    def kill_soon() -> None:
        time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)

    threading.Thread(target=kill_soon).start()
    status, body = env.decode(data["handoff"], max_tokens=32768 // 16)
    if status == 200:  # the decode beat the kill; the next request meets the dead child
        time.sleep(0.3)
        status, body = env.prefill("after the kill")
        assert status == 200, body  # a fresh child was started and probed
    else:
        assert (status, body["error"]["code"]) == (503, "unavailable") and body["error"]["retryable"] is True
    listed = ok(env.api.get("/werk/v1/states"))["states"]
    assert {s["id"] for s in before} <= {s["id"] for s in listed}  # catalog intact
    data = ok(env.prefill("a brand new prompt"))
    fresh = env.adapter.current()
    assert fresh is not None and fresh.generation != old_generation
    old = next(s for s in ok(env.api.get("/werk/v1/states"))["states"] if s["id"] == before[0]["id"])
    assert old["reusable"] is True  # same compatibility key: the fresh generation may restore it
    again = ok(env.prefill(policy={"reuse": "required"}))
    assert again["reused"] is True and again["state_id"] == before[0]["id"]
    ok(env.decode(again["handoff"]))
    assert env.adapter.last_decode["source"] == "stored" and env.adapter.last_decode["prompt_n"] == 1


@covers_hooks("werk_count_tokens", "werk_chat_limits", "werk_workers", "werk_deployment_plan")
def test_chat_planning_routes(env: Env) -> None:
    request = {"messages": [{"role": "user", "content": "count these words please"}]}
    count = ok(env.api.post("/werk/v1/chat/count_tokens", request))
    proc = env.adapter.current()
    assert proc is not None and proc.client is not None
    rendered = proc.client.apply_template(request["messages"])
    assert count["input_tokens"] == len(proc.client.tokenize(rendered, add_special=True, parse_special=True))
    limits = ok(env.api.get("/werk/v1/chat/limits"))
    assert limits == {
        "schema_version": 1,
        "model": "tiny",
        "context_tokens": 2048,
        "max_output_tokens": 256,
        "max_concurrent_requests": 1,  # the ordinary slot; the state slot serves no /v1 traffic
    }
    obs = ok(env.api.get("/werk/v1/observability"))
    (worker,) = obs["workers"]
    assert worker["pid"] == proc.pid and worker["slots"] == 2
    assert obs["context_per_request_tokens"] == 2048 and obs["context_capacity_tokens"] == 4096
    reasoning = ok(env.api.get("/werk/v1/chat/reasoning"))
    assert reasoning["supported"] is False and reasoning["tiers"] == [] and reasoning["default_tier"] is None
    deployments = ok(env.api.get("/werk/v1/deployments"))
    (plan,) = deployments["plans"]
    assert plan["plan"]["parallel_slots"] == 2 and plan["plan"]["context_per_slot"] == 2048
    assert plan["plan"]["device"] == "cpu" and plan["plan"]["endpoint"] == "local"
    assert "<path>" in plan["plan"]["arguments"] and not any(a.startswith("/") for a in plan["plan"]["arguments"])
    (inventory,) = deployments["inventory"]
    assert (inventory["state"], inventory["pid"], inventory["backend"]) == ("ready", proc.pid, "llama.cpp")
    assert deployments["slots"] == [{"instance": inventory["id"], "total": 2, "busy": 0, "free": 2}]
    caps = {c["id"]: c["status"] for c in ok(env.api.get("/werk/v1/capabilities"))}
    assert caps["runtime.placement"] == "supported"


def test_probe_failure_keeps_state_unavailable(
    tmp_path: Path, llama_server_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    monkeypatch.setenv("WERK_LLAMA_ARGS", f"--slot-save-path {elsewhere}")  # escapes the private directory
    home = tmp_path / "home"
    home.mkdir()
    install(home, tiny_model)
    host = build_host(config(home, llama_server_path))
    with running(host) as base:
        api = Api(base, KEY)
        status, body = api.post(
            "/werk/v1/prefill",
            {"model_id": "tiny", "input": {"type": "text", "text": "x y z"}, "allow_experimental": True},
        )
        assert (status, body["error"]["code"]) == (503, "unavailable")
        caps = {c["id"]: c for c in api.get("/werk/v1/capabilities")[1]["data"]}
        assert caps["runtime.pd.prefill"]["status"] == "unavailable"
        assert "probe failed" in caps["runtime.pd.prefill"]["detail"]
        assert caps["runtime.model_residency"]["status"] == "supported"
        assert api.get("/werk/v1/states")[1]["data"]["states"] == []


def test_no_child_survives_werk_serve_sigterm(tmp_path: Path, llama_server_path: Path, tiny_model: Path) -> None:
    home = tmp_path / "home"
    install(home, tiny_model)
    env = {**os.environ, "WERK_HOME": str(home), "WERK_API_KEYS": KEY, "WERK_LLAMA_SERVER": str(llama_server_path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "werk_host", "serve", "--port", "0", "--model", "tiny"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        assert proc.stdout is not None
        port = json.loads(proc.stdout.readline())["port"]
        obs = Api(f"http://127.0.0.1:{port}", KEY).get("/werk/v1/observability")[1]["data"]
        child = obs["workers"][0]["pid"]
        os.kill(child, 0)  # alive
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"llama-server child {child} survived werk serve")


def test_cache_list_shows_the_live_child_directory_as_active(env: Env) -> None:
    import io
    from argparse import Namespace

    from werk_host.testing.host import cache_list_command

    out = io.StringIO()
    assert cache_list_command(Namespace(home=str(env.host.config.home), json=True), out=out) == 0
    backends = json.loads(out.getvalue())["backend_caches"]
    proc = env.adapter.current()
    assert proc is not None and proc.run_dir is not None
    (entry,) = [b for b in backends if b["id"].endswith(proc.run_dir.name)]
    assert entry["active"] is True and entry["plugin"] == "llamacpp"

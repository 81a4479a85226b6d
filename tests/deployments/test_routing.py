"""Deployments over the in-memory reference backend: routing, control selection, lifecycle,
failure isolation and the memory guard (the same rules run over real llama-server children in
plugins/llamacpp/tests/test_llamacpp_deployments.py)."""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import falcon.testing
import pytest

from werk_host.cli import main
from werk_host.config import HostConfig, ServerLimits
from werk_host.deployments.profile import ProfileError
from werk_host.errors import ErrorCode, WerkError
from werk_host.models import ModelFile, ModelManifest, ModelRegistry
from werk_host.pluginhost import PluginHost
from werk_host.seam import AdapterFactory
from werk_host.server import Host, build_host
from werk_host.testing.hosts import running
from werk_host.testing.reference import BACKEND_ID, MemoryAdapter, MemoryBackendPlugin

KEY = "sk-werk-routing-test-0042"

PROFILE = """
[[instance]]
id = "a1"
model = "alpha"
preload = true
default = true

[[instance]]
id = "a2"
model = "alpha"

[[instance]]
id = "b"
model = "beta"
keep_alive = "0"

[[instance]]
id = "bad"
model = "broken"

[alias.pair]
replicas = ["a1", "a2"]
"""


class CountingPlugin(MemoryBackendPlugin):
    """The reference backend, counting adapter creations; the model ``broken`` fails to start."""

    def __init__(self) -> None:
        super().__init__()
        self.created: list[str] = []
        self._lock = threading.Lock()

    def create(self, config: HostConfig, model: ModelManifest | None) -> MemoryAdapter:
        assert model is not None
        time.sleep(0.05)  # a start takes a while: concurrent first requests overlap it
        if model.name == "broken":
            raise WerkError(ErrorCode.UNAVAILABLE, "native loader said: /srv/secret/broken.bin is corrupt")
        with self._lock:
            self.created.append(model.name)
        return super().create(config, model)


def register(home: Path, name: str) -> None:
    weights = home.parent / f"{name}.bin"
    weights.write_bytes(f"weights of {name}".encode())
    ModelRegistry(home).add(ModelManifest.from_paths(name, [weights], backend=BACKEND_ID))


def build(
    tmp_path: Path, profile_text: str = PROFILE, limits: ServerLimits | None = None
) -> tuple[Host, CountingPlugin]:
    home = tmp_path / "home"
    home.mkdir()
    for name in ("alpha", "beta", "broken"):
        register(home, name)
    profile = tmp_path / "deployments.toml"
    profile.write_text(profile_text)
    plugin = CountingPlugin()
    plugins = PluginHost()
    plugins.register(plugin, "testbackend")
    config = HostConfig(home=home, api_keys=(KEY,), profile=profile, limits=limits or ServerLimits())
    host = build_host(config, plugins=plugins)
    return host, plugin


@pytest.fixture
def env(tmp_path: Path) -> Iterator[tuple[Host, CountingPlugin, falcon.testing.TestClient]]:
    host, plugin = build(tmp_path)
    try:
        yield host, plugin, falcon.testing.TestClient(host.app, headers={"Authorization": f"Bearer {KEY}"})
    finally:
        host.close()


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """``werk serve`` configures the root logger for its process; put the test run's back."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def chat(client: falcon.testing.TestClient, model: str | None) -> falcon.testing.Result:
    body: dict[str, Any] = {"messages": [{"role": "user", "content": "one two"}], "max_tokens": 2}
    if model is not None:
        body["model"] = model
    return client.simulate_post("/v1/chat/completions", json=body)


def served_by(result: falcon.testing.Result) -> str:
    return str(result.headers["x-werk-deployment"])


def test_only_preloaded_instances_start_with_the_server(env: Any) -> None:
    host, plugin, client = env
    assert plugin.created == ["alpha"]
    states = {i["id"]: i["state"] for i in client.simulate_get("/werk/v1/deployments").json["data"]["inventory"]}
    assert states == {"a1": "ready", "a2": "cold", "b": "cold", "bad": "cold"}


def test_routing_by_id_model_and_alias(env: Any) -> None:
    _, _, client = env
    assert served_by(chat(client, "a2")) == "a2"
    assert served_by(chat(client, "beta")) == "b"
    assert served_by(chat(client, None)) == "a1"
    assert {served_by(chat(client, "pair")) for _ in range(4)} == {"a1", "a2"}
    assert {served_by(chat(client, "alpha")) for _ in range(4)} == {"a1", "a2"}  # a model served twice
    missing = chat(client, "gamma")
    assert missing.status_code == 404 and missing.json["error"]["code"] == "model_not_found"
    listed = {m["id"] for m in client.simulate_get("/v1/models").json["data"]}
    assert listed == {"a1", "a2", "b", "bad", "pair"}


def test_an_alias_prefers_the_replica_with_fewer_requests_in_flight(env: Any) -> None:
    host, _, client = env
    deployments = host.fleet.deployments
    a1 = deployments.instances["a1"]
    a1.enter()  # one request in flight on a1
    try:
        assert {served_by(chat(client, "pair")) for _ in range(3)} == {"a2"}
    finally:
        a1.leave()


def test_control_header_selection(env: Any) -> None:
    _, _, client = env
    info = client.simulate_get("/werk/v1/chat/limits", headers={"X-Werk-Deployment": "b"})
    assert info.status_code == 200 and info.json["data"]["model"] == "beta"
    alias = client.simulate_get("/werk/v1/info", headers={"X-Werk-Deployment": "pair"})
    assert alias.status_code == 400 and alias.json["error"]["code"] == "invalid_request"
    unknown = client.simulate_get("/werk/v1/info", headers={"X-Werk-Deployment": "zzz"})
    assert unknown.status_code == 404 and unknown.json["error"]["code"] == "not_found"
    body = {"model_id": "beta", "input": {"type": "text", "text": "x y"}, "allow_experimental": True}
    prefill = client.simulate_post("/werk/v1/prefill", json=body, headers={"X-Werk-Deployment": "b"})
    assert prefill.status_code == 200
    handoff = prefill.json["data"]["handoff"]
    other = client.simulate_post(
        "/werk/v1/decode", json={"handoff": handoff, "allow_experimental": True}, headers={"X-Werk-Deployment": "a1"}
    )
    assert other.status_code == 410  # a handoff is bound to the instance that issued it


def test_a_cold_instance_reports_cold_evidence_and_starts_on_use(env: Any) -> None:
    _, plugin, client = env
    caps = client.simulate_get("/werk/v1/capabilities", headers={"X-Werk-Deployment": "a2"}).json["data"]
    residency = next(c for c in caps if c["id"] == "runtime.model_residency")
    assert residency["status"] == "unavailable" and "cold" in residency["detail"]
    limits = client.simulate_get("/werk/v1/chat/limits", headers={"X-Werk-Deployment": "a2"}).json["data"]
    assert limits["context_tokens"] is None  # discovery never starts a cold instance
    assert plugin.created == ["alpha"]
    counted = client.simulate_post(
        "/werk/v1/chat/count_tokens",
        json={"messages": [{"role": "user", "content": "a b c"}]},
        headers={"X-Werk-Deployment": "a2"},
    )
    assert counted.status_code == 200 and plugin.created == ["alpha", "alpha"]  # using it started it


def test_sixteen_concurrent_first_requests_start_an_instance_once(tmp_path: Path) -> None:
    # one key's 16 requests at once, all admitted (docs/operations.md, "Inference concurrency")
    host, plugin = build(tmp_path, limits=ServerLimits(threads=24, inference_per_key=16, inference_queue=16))
    with running(host) as url:
        from werk_host.testing.api import Api

        api = Api(url, KEY)
        results: list[int] = []

        def first() -> None:
            body = {"model": "a2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
            results.append(api.post("/v1/chat/completions", body)[0])

        threads = [threading.Thread(target=first) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert results == [200] * 16
    assert plugin.created.count("alpha") == 2  # a1 at start, a2 exactly once


def test_keep_alive_zero_stops_after_each_request_and_restarts_on_use(env: Any) -> None:
    host, plugin, client = env
    assert chat(client, "b").status_code == 200
    b = host.fleet.deployments.instances["b"]
    assert b.view().state == "cold"
    assert plugin.adapters[-1].closed  # its adapter was closed
    assert chat(client, "b").status_code == 200 and plugin.created.count("beta") == 2


def test_a_failed_start_stays_on_its_instance_and_is_redacted(env: Any) -> None:
    host, _, client = env
    failed = chat(client, "bad")
    assert failed.status_code == 503
    message = failed.json["error"]["message"]
    assert "bad" in message and "/srv" not in message and "corrupt" not in message
    inventory = {i["id"]: i for i in client.simulate_get("/werk/v1/deployments").json["data"]["inventory"]}
    assert inventory["bad"]["state"] == "failed" and "/srv" not in inventory["bad"]["error"]
    assert chat(client, "a1").status_code == 200  # the others are untouched
    again = chat(client, "bad")  # within the retry window: answered from the recorded reason
    assert again.status_code == 503 and again.json["error"]["message"] == message


def test_a_model_larger_than_available_memory_is_refused_before_it_starts(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    huge = tmp_path / "huge.bin"
    with open(huge, "wb") as handle:
        handle.truncate(1 << 42)  # a sparse 4 TiB file: its size is what the guard reads
    manifest = ModelManifest("huge", (ModelFile(str(huge), 1 << 42, "0" * 64),), BACKEND_ID, {})
    ModelRegistry(home).add(manifest)
    plugin = CountingPlugin()
    plugins = PluginHost()
    plugins.register(plugin, "testbackend")
    host = build_host(HostConfig(home=home, api_keys=(KEY,), models=("huge",)), plugins=plugins)
    try:
        client = falcon.testing.TestClient(host.app, headers={"Authorization": f"Bearer {KEY}"})
        answer = chat(client, "huge")
        assert answer.status_code == 429 and answer.json["error"]["code"] == "resource_exhausted"
        assert "host memory" in answer.json["error"]["message"]
        inventory = client.simulate_get("/werk/v1/deployments").json["data"]["inventory"]
        assert inventory[0]["state"] == "failed" and "MiB" in inventory[0]["error"]
        assert plugin.created == []
    finally:
        host.close()


def test_repeated_models_are_one_instance_each(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    for name in ("alpha", "beta"):
        register(home, name)
    plugins = PluginHost()
    plugins.register(CountingPlugin(), "testbackend")
    host = build_host(HostConfig(home=home, api_keys=(KEY,), models=("alpha", "beta")), plugins=plugins)
    try:
        client = falcon.testing.TestClient(host.app, headers={"Authorization": f"Bearer {KEY}"})
        inventory = client.simulate_get("/werk/v1/deployments").json["data"]["inventory"]
        assert [(i["id"], i["default"], i["state"]) for i in inventory] == [
            ("alpha", True, "ready"),
            ("beta", False, "ready"),
        ]
    finally:
        host.close()


def test_a_profile_naming_no_installed_backend_fails_at_start(tmp_path: Path, restore_logging: None) -> None:
    home = tmp_path / "home"
    home.mkdir()
    register(home, "alpha")
    profile = tmp_path / "p.toml"
    profile.write_text('[[instance]]\nid = "x"\nmodel = "alpha"\nbackend = "no-such-backend"\n')
    assert main(["serve", "--home", str(home), "--profile", str(profile), "--port", "0"]) == 2


def test_werk_serve_refuses_an_invalid_profile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], restore_logging: None
) -> None:
    profile = tmp_path / "p.toml"
    profile.write_text('[[instance]]\nid = "x"\nmodel = "nope"\n')
    assert main(["serve", "--home", str(tmp_path / "home"), "--profile", str(profile), "--port", "0"]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("werk: invalid profile: ") and "p.toml:3: instance[0].model" in line and "nope" in line


def test_werk_deployments_prints_the_inventory(env: Any, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    host, _, _ = env
    with running(host) as url:
        monkeypatch.setenv("WERK_API_KEY", KEY)
        assert main(["deployments", "--server", url]) == 0
        table = capsys.readouterr().out.splitlines()
        assert main(["deployments", "--server", url, "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
    assert table[0].split() == [
        "ID",
        "BACKEND",
        "MODEL",
        "STATE",
        "SINCE",
        "PID",
        "IN-FLIGHT",
        "SLOTS",
        "KEEP-ALIVE",
        "ALIASES",
    ]
    rows = {line.split()[0]: line.split() for line in table[1:] if line and not line.startswith("bad:")}
    assert rows["a1*"][1:4] == [BACKEND_ID, "alpha", "ready"] and rows["a1*"][-1] == "pair"
    assert rows["b"][3] == "cold" and rows["b"][8] == "0s"
    assert [i["id"] for i in doc["inventory"]] == ["a1", "a2", "b", "bad"]


def test_factory_for_an_unknown_backend_is_not_chosen() -> None:
    factories = [AdapterFactory("other", lambda m: True, lambda c, m: MemoryAdapter("x"))]
    from werk_host.deployments.registry import choose_factory

    manifest = ModelManifest("alpha", (), BACKEND_ID, {})
    assert choose_factory(factories, manifest, None) is None
    assert choose_factory(factories, ModelManifest("alpha", (), None, {}), None) is factories[0]


def test_two_accepting_backends_without_an_explicit_one_are_an_error_naming_both() -> None:
    from werk_host.deployments.registry import BackendTie, choose_factory

    first = AdapterFactory("one", lambda m: True, lambda c, m: MemoryAdapter("x"), plugin_name="p1")
    second = AdapterFactory("two", lambda m: True, lambda c, m: MemoryAdapter("x"), plugin_name="p2")
    unpinned = ModelManifest("alpha", (), None, {})
    with pytest.raises(BackendTie) as tie:
        choose_factory([first, second], unpinned, None)
    assert "one (plugin p1)" in str(tie.value) and "two (plugin p2)" in str(tie.value)
    assert choose_factory([first, second], unpinned, "two") is second  # an explicit backend wins
    assert choose_factory([first, second], ModelManifest("alpha", (), "p1", {}), None) is first


def test_werk_runtime_selects_an_instance_with_deployment(
    env: Any, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    host, _, _ = env
    with running(host) as url:
        monkeypatch.setenv("WERK_API_KEY", KEY)
        assert main(["runtime", "limits", "--server", url, "--deployment", "b", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["model"] == "beta"
        assert main(["runtime", "info", "--server", url, "--deployment", "pair", "--json"]) != 0
        assert json.loads(capsys.readouterr().err)["error"]["code"] == "invalid_request"
        assert main(["runtime", "info", "--server", url, "--deployment", "nope", "--json"]) != 0
        assert json.loads(capsys.readouterr().err)["error"]["code"] == "not_found"


def test_metrics_label_requests_with_their_instance(env: Any) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    _, _, client = env
    assert served_by(chat(client, "pair")) in ("a1", "a2")
    assert chat(client, "b").status_code == 200
    client.simulate_get("/werk/v1/info", headers={"X-Werk-Deployment": "a2"})
    text = client.simulate_get("/metrics").text
    seen = {
        (s.labels["instance"], s.labels["route"])
        for family in text_string_to_metric_families(text)
        if family.name == "werk_http_requests"
        for s in family.samples
        if s.name == "werk_http_requests_total"
    }
    assert ("b", "/v1/chat/completions") in seen and ("a2", "/werk/v1/info") in seen
    states = {
        (s.labels["instance"], s.labels["state"]): s.value
        for family in text_string_to_metric_families(text)
        if family.name == "werk_instance_state"
        for s in family.samples
    }
    assert states[("a1", "ready")] == 1 and states[("bad", "cold")] == 1 and states[("bad", "failed")] == 0


AGENT_PROFILE = (
    PROFILE
    + """
[alias.agents]
replicas = ["b"]
match = ["claude-*", "gpt-5*"]

[alias.wide]
replicas = ["a2"]
match = ["claude-opus-*", "o4-*"]

[routing]
fallback = "a2"
"""
)


def test_agent_model_names_route_by_pattern_then_fallback(tmp_path: Path) -> None:
    """Issue 30 item 5: an alias's ``match`` globs claim the names agents send (the first alias
    in profile order wins), ``[routing] fallback`` takes any other unknown name; exact ids,
    aliases and model names still win over both."""
    host, _ = build(tmp_path, AGENT_PROFILE)
    try:
        client = falcon.testing.TestClient(host.app, headers={"Authorization": f"Bearer {KEY}"})
        assert served_by(chat(client, "claude-opus-4-8")) == "b"  # agents' pattern is listed first
        assert served_by(chat(client, "gpt-5.1-codex")) == "b"
        assert served_by(chat(client, "o4-mini")) == "a2"
        assert served_by(chat(client, "some-other-name")) == "a2"  # the fallback
        assert served_by(chat(client, "a1")) == "a1"  # an id is never shadowed by a pattern
        assert served_by(chat(client, "beta")) == "b"
        counted = client.simulate_post(
            "/werk/v1/chat/count_tokens",
            json={"model": "claude-sonnet-4", "messages": [{"role": "user", "content": "hi"}]},
        )
        assert counted.status_code == 200, counted.text
        assert counted.json["data"]["model"] == "claude-sonnet-4"
    finally:
        host.close()


def test_an_unknown_model_is_named_with_what_is_served(env: Any) -> None:
    """Without a pattern or fallback, the 404 names the model asked for and lists what a
    ``model`` value may name, on ``/v1`` and chat planning alike."""
    _, _, client = env
    missing = chat(client, "claude-opus-4-8")
    assert missing.status_code == 404
    message = missing.json["error"]["message"]
    assert message == 'model "claude-opus-4-8" is not served here (served: a1, a2, b, bad, pair, alpha, beta, broken)'
    planned = client.simulate_post(
        "/werk/v1/chat/count_tokens", json={"model": "gpt-5", "messages": [{"role": "user", "content": "hi"}]}
    )
    assert planned.status_code == 404 and '"gpt-5" is not served here' in planned.json["error"]["message"]
    long = chat(client, "x" * 200)
    assert long.status_code == 404 and "x" * 129 not in long.json["error"]["message"]


@pytest.mark.parametrize(
    ("tail", "message"),
    [
        ('[alias.p]\nreplicas = ["b"]\nmatch = "claude-*"\n', "match: must be an array of model-name patterns"),
        ('[alias.p]\nreplicas = ["b"]\nmatch = ["bad name"]\n', "match[0]: must be a model-name pattern"),
        (
            '[alias.p]\nreplicas = ["b"]\nmatch = ["c-*"]\n[alias.q]\nreplicas = ["b"]\nmatch = ["c-*"]\n',
            'match: "c-*" is matched by alias p already',
        ),
        ('[routing]\nfallback = "nope"\n', "fallback: must be an instance id or an alias"),
        ('[routing]\nfallbak = "b"\n', "unknown key; did you mean fallback?"),
    ],
)
def test_pattern_and_fallback_profile_errors(tmp_path: Path, tail: str, message: str) -> None:
    with pytest.raises(ProfileError, match=re.escape(message)):
        build(tmp_path, PROFILE + tail)

"""Werk reasoning tiers on llama.cpp (docs/compat.md, "Reasoning tiers on llama.cpp"), against
real llama-server children: a generated model whose chat template has a thinking switch
(``generate_model(thinking=True)``, Qwen3-style), the plain generated model and SmolLM2 (no
switch in either template).

What is proven: the profile comes from the running server's launch configuration (tiers and
limits by the host's resolver, launch budget from ``--reasoning-budget``), and only where the
switch is verified; a tier is forwarded as llama-server's thinking switch and budget, seen in
the prompt the server renders (``none`` renders the closed thinking block) and in the thinking
the server lets the model produce (a forced ``</think>`` after exactly the tier's budget);
counting with a tier gives the prompt count the chat then reports; a tier the profile does not
offer, or one combined with a native thinking control, is refused before anything is generated;
Ollama's ``think`` takes the same path.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from werk_llamacpp import plugin as llama_plugin
from werk_llamacpp.adapter import LlamaCppAdapter
from werk_llamacpp.process import LlamaServerProcess
from werk_llamacpp.reasoning import ThinkingControl, thinking_control
from werk_llamacpp.testing.testmodel import THINK_END, THINK_START, generate_model

from werk_host.plugin import HostConfig, ModelManifest, ReasoningTierId
from werk_host.testing.host import Host, ModelRegistry, PluginHost, build_host
from werk_host.testing.hosts import running, settled

pytestmark = pytest.mark.llamaserver
KEY = "sk-werk-reasoning-test-3317"
#: per-request context of every instance: 8192 over 2 slots
CONTEXT = 4096
PROFILE = """
[[instance]]
id = "think"
model = "thinking"
options = { parallel = 2, ctx = 8192 }
preload = true
default = true

[[instance]]
id = "plain"
model = "plain"
options = { parallel = 2, ctx = 8192 }
preload = true

[[instance]]
id = "smol"
model = "smollm2"
options = { parallel = 2, ctx = 8192 }
preload = true
"""
HELLO = [{"role": "user", "content": "hello there"}]
TIERS = ("none", "low", "medium", "high", "max", "ultra")


@dataclass
class Env:
    url: str
    host: Host

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", int(self.url.rsplit(":", 1)[1]), timeout=300)
        headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
        try:
            conn.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
            return resp.status, json.loads(raw) if raw else None
        finally:
            conn.close()

    def profile(self, model: str, max_output_tokens: int) -> dict[str, Any]:
        status, doc = self.call("GET", f"/werk/v1/chat/reasoning?model={model}&max_output_tokens={max_output_tokens}")
        assert status == 200, doc
        data: dict[str, Any] = doc["data"]
        return data

    def count(self, model: str, tier: str | None, max_tokens: int | None = None) -> int:
        body: dict[str, Any] = {"model": model, "messages": HELLO}
        if tier is not None:
            body["werk"] = {"reasoning": {"tier": tier}}
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        status, doc = self.call("POST", "/werk/v1/chat/count_tokens", body)
        assert status == 200, doc
        count: int = doc["data"]["input_tokens"]
        return count

    def chat(self, model: str, tier: str | None, max_tokens: int, **extra: Any) -> tuple[int, Any]:
        body: dict[str, Any] = {"model": model, "messages": HELLO, "max_tokens": max_tokens, "temperature": 0}
        if tier is not None:
            body["werk"] = {"reasoning": {"tier": tier}}
        return self.call("POST", "/v1/chat/completions", {**body, **extra})

    def adapter(self, instance: str) -> LlamaCppAdapter:
        deployments = self.host.fleet.deployments
        assert deployments is not None
        adapter = deployments.instances[instance].peek()
        assert isinstance(adapter, LlamaCppAdapter)
        return adapter

    def child_counters(self, instance: str) -> tuple[int, int]:
        """The child's own ``(prompt tokens, predicted tokens)`` totals from its ``/metrics``."""
        proc = self.adapter(instance).current()
        assert proc is not None
        client = proc.new_client(timeout=30)
        try:
            text = client.metrics()
        finally:
            client.close()
        found = {}
        for line in text.splitlines():
            name, _, value = line.partition(" ")
            if name in ("llamacpp:prompt_tokens_total", "llamacpp:tokens_predicted_total"):
                found[name] = int(float(value))
        return found["llamacpp:prompt_tokens_total"], found["llamacpp:tokens_predicted_total"]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("reasoning-models")
    return generate_model(root / "thinking.gguf", thinking=True), generate_model(root / "plain.gguf")


@pytest.fixture(scope="module")
def env(
    tmp_path_factory: pytest.TempPathFactory, llama_server_path: Path, smollm2_gguf: Path, models: tuple[Path, Path]
) -> Iterator[Env]:
    root = tmp_path_factory.mktemp("reasoning")
    home = root / "home"
    home.mkdir()
    registry = ModelRegistry(home)
    for name, path in (("thinking", models[0]), ("plain", models[1]), ("smollm2", smollm2_gguf)):
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
    )
    host = build_host(config, plugins=plugins)
    with running(host) as url:
        yield Env(url, host)


def _tier_ids(profile: dict[str, Any], available: bool) -> list[str]:
    return [t["id"] for t in profile["tiers"] if t["available"] is available]


# -- the profile -------------------------------------------------------------------------------


def test_the_thinking_model_reports_tiers_from_its_launch_configuration(env: Env) -> None:
    profile = env.profile("think", 2048)
    assert profile["supported"] is True and profile["backend"] == "llama.cpp"
    assert profile["source"] == "worker_launch_configuration"
    # launch budget -1 (unlimited), thinking on: the 2048-token output leaves 1536 for reasoning
    assert profile["limits"] == {
        "context_tokens": CONTEXT,
        "output_tokens": 2048,
        "answer_reserve_tokens": 512,
        "reasoning_tokens": 1536,
    }
    assert [t["id"] for t in profile["tiers"]] == list(TIERS)
    assert _tier_ids(profile, True) == ["none", "low", "medium"]
    assert (profile["default_tier"], profile["default_adjusted_to_limits"]) == ("medium", True)
    low = next(t for t in profile["tiers"] if t["id"] == "low")
    assert (low["reasoning_tokens"], low["minimum_output_tokens"]) == (512, 1024)
    # the output is bounded by the served context: 4096 - 512 = 3584 leaves 3072 for reasoning
    wide = env.profile("think", 100_000)
    assert wide["limits"]["output_tokens"] == CONTEXT - 512 and wide["limits"]["reasoning_tokens"] == 3072
    assert _tier_ids(wide, True) == ["none", "low", "medium", "high"] and wide["default_tier"] == "high"
    # the default output allowance (256) leaves nothing for reasoning: only none
    small = env.profile("think", 256)
    assert _tier_ids(small, True) == ["none"] and small["default_tier"] == "none"


@pytest.mark.parametrize("instance", ["plain", "smol"])
def test_templates_without_a_thinking_switch_are_unsupported(env: Env, instance: str) -> None:
    profile = env.profile(instance, 4096)
    assert (profile["supported"], profile["tiers"], profile["default_tier"]) == (False, [], None)
    assert profile["source"] is None and profile["limits"] is None


def test_launch_arguments_decide_budget_default_and_effort(
    llama_server_path: Path, models: tuple[Path, Path], tmp_path: Path
) -> None:
    """``--reasoning-budget``, ``--reasoning off`` and ``--reasoning-effort`` as the running
    server has them; ``--no-jinja`` leaves the switch unrendered: no control."""
    cases: tuple[tuple[str, ThinkingControl | None], ...] = (
        ("--reasoning-budget 700", ThinkingControl(True, 700, None)),
        (
            "--reasoning-budget 900 --reasoning off --reasoning-effort low",
            ThinkingControl(False, 900, ReasoningTierId.LOW),
        ),
        ("--no-jinja", None),
    )
    for args, expected in cases:
        proc = LlamaServerProcess(models[0], binary=llama_server_path, ctx=2048, env_args=args, work_dir=tmp_path)
        with proc:
            assert thinking_control(proc) == expected, args


def test_a_launch_budget_caps_the_tiers(
    monkeypatch: pytest.MonkeyPatch, llama_server_path: Path, models: tuple[Path, Path], tmp_path: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    ModelRegistry(home).add(ModelManifest.from_paths("thinking", [models[0]], backend="llama.cpp"))
    monkeypatch.setenv("WERK_LLAMA_ARGS", "--reasoning-budget 700")
    plugins = PluginHost()
    plugins.register(llama_plugin, "llamacpp")
    config = HostConfig(
        home=home,
        api_keys=(KEY,),
        model="thinking",
        backend_options={"llamacpp": {"llama_server": str(llama_server_path), "ctx": 8192}},
    )
    host = build_host(config, plugins=plugins)
    with running(host) as url:
        profile = Env(url, host).profile("thinking", 2048)
    assert profile["limits"]["reasoning_tokens"] == 700
    assert _tier_ids(profile, True) == ["none", "low"]
    assert (profile["default_tier"], profile["default_adjusted_to_limits"]) == ("low", False)


# -- forwarding --------------------------------------------------------------------------------


def test_tier_none_renders_the_closed_thinking_block_and_counts_match(env: Env) -> None:
    proc = env.adapter("think").current()
    assert proc is not None
    client = proc.new_client(timeout=30)
    try:
        off = client.apply_template(HELLO, chat_template_kwargs={"enable_thinking": False})
        on = client.apply_template(HELLO, chat_template_kwargs={"enable_thinking": True})
        expected_off = len(client.tokenize(off, add_special=True, parse_special=True))
        expected_on = len(client.tokenize(on, add_special=True, parse_special=True))
    finally:
        client.close()
    assert off == on + f"{THINK_START}\n\n{THINK_END}\n\n"
    native = env.count("think", None)
    none = env.count("think", "none")
    low = env.count("think", "low", max_tokens=1100)
    assert (none, low, native) == (expected_off, expected_on, expected_on)
    # "default" resolves per request: 256 output tokens leave only none, 2048 allow medium
    assert env.count("think", "default") == none
    assert env.count("think", "default", max_tokens=2048) == low
    # the chat sends exactly what was counted
    status, doc = env.chat("think", "none", 4)
    assert status == 200, doc
    assert doc["usage"]["prompt_tokens"] == none
    status, doc = env.chat("think", "low", 4)
    assert status == 400 and doc["error"]["code"] == "invalid_reasoning_tier"  # 4 < 1024 output
    status, doc = env.chat("think", "low", 1100, logit_bias={"2": 100})  # </s> at once: one token
    assert status == 200, doc
    assert doc["usage"]["prompt_tokens"] == low


def test_the_tier_budget_ends_the_thinking(env: Env) -> None:
    """The model is biased to think forever (``<think>`` every token); llama-server forces
    ``</think>`` (here a stop string) after exactly the forwarded budget, and without a tier it
    never does."""
    think_id = _token_id(env, THINK_START)
    biased: dict[str, Any] = {"logit_bias": {str(think_id): 100}, "reasoning_format": "none", "stop": [THINK_END]}
    for tier, max_tokens, budget in (("low", 1100, 512), ("default", 1600, 1024)):  # 1600 - 512 leaves medium
        status, doc = env.chat("think", tier, max_tokens, **biased)
        assert status == 200, doc
        choice = doc["choices"][0]
        assert choice["finish_reason"] == "stop", (tier, doc["usage"])
        assert choice["message"]["content"].count(THINK_START) == 1 + budget  # the opening tag, then the budget
    status, doc = env.chat("think", None, 600, **biased)  # native: the launch budget is unlimited
    assert status == 200, doc
    assert (doc["choices"][0]["finish_reason"], doc["usage"]["completion_tokens"]) == ("length", 600)


def _token_id(env: Env, text: str) -> int:
    proc = env.adapter("think").current()
    assert proc is not None
    client = proc.new_client(timeout=30)
    try:
        ids = client.tokenize(text, parse_special=True)
    finally:
        client.close()
    assert len(ids) == 1, ids
    return ids[0]


# -- refusals --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "tier", "max_tokens", "extra"),
    [
        ("think", "high", 2048, {}),  # high needs 2560 output tokens
        ("think", "medium", 1024, {}),
        ("think", "turbo", 2048, {}),  # no such tier
        ("think", "low", 2048, {"reasoning_effort": "low"}),  # native effort and a tier
        ("think", "low", 2048, {"chat_template_kwargs": {"enable_thinking": False}}),
        ("think", "low", 2048, {"reasoning_budget_tokens": 64}),
        ("plain", "low", 2048, {}),  # no verified profile: only "default"
        ("smol", "none", 2048, {}),
    ],
)
def test_unavailable_tiers_are_refused_before_generation(
    env: Env, model: str, tier: str, max_tokens: int, extra: dict[str, Any]
) -> None:
    before = env.child_counters(model)
    status, doc = env.chat(model, tier, max_tokens, **extra)
    assert status == 400, doc
    assert doc["error"]["code"] == "invalid_reasoning_tier"
    body: dict[str, Any] = {"model": model, "messages": HELLO, "max_tokens": max_tokens, **extra}
    body["werk"] = {"reasoning": {"tier": tier}}
    status, doc = env.call("POST", "/werk/v1/chat/count_tokens", body)
    assert status == 400, doc
    assert env.child_counters(model) == before  # nothing was evaluated or generated


@pytest.mark.parametrize("instance", ["plain", "smol"])
def test_default_on_an_unsupported_runtime_keeps_the_native_default(env: Env, instance: str) -> None:
    assert env.count(instance, "default") == env.count(instance, None)
    status, doc = env.chat(instance, "default", 4)
    assert status == 200, doc
    assert doc["usage"]["prompt_tokens"] == env.count(instance, None)


# -- Ollama's think ----------------------------------------------------------------------------


def test_ollama_think_takes_the_same_path(env: Env) -> None:
    messages = [{"role": "user", "content": HELLO[0]["content"]}]
    base: dict[str, Any] = {"model": "think", "messages": messages, "stream": False}

    def prompt_tokens(body: dict[str, Any]) -> int:
        """The prompt the chat rendered, as the backend counted it: the /api/chat answer's
        prompt_eval_count leaves out what llama-server took from its cache, so the host's total
        of reported prompt tokens is read around the request (its answer closed)."""
        before = env.host.service.chat_stats.read().prompt_tokens_total
        status, doc = env.call("POST", "/api/chat", body)
        assert status == 200, doc
        assert doc["prompt_eval_count"] > 0
        return settled(env.host).prompt_tokens_total - before

    assert prompt_tokens({**base, "think": "low", "options": {"num_predict": 1100}}) == env.count(
        "think", "low", max_tokens=1100
    )
    # think: true is the default tier, resolved for the request's output: 256 leaves only none
    assert prompt_tokens({**base, "think": True, "options": {"num_predict": 4}}) == env.count("think", "none")
    # think: false turns thinking off where the profile is verified (tier none) ...
    off = prompt_tokens({**base, "think": False, "options": {"num_predict": 4}})
    assert off == env.count("think", "none") != env.count("think", None)
    # ... and asks for nothing where it is not
    smol = {**base, "model": "smol", "think": False, "options": {"num_predict": 4}}
    assert prompt_tokens(smol) == env.count("smol", None)
    status, doc = env.call("POST", "/api/chat", {**base, "think": "high", "options": {"num_predict": 1100}})
    assert status == 400 and set(doc) == {"error"}, doc
    status, doc = env.call("POST", "/api/chat", {**base, "model": "smol", "think": "low"})
    assert status == 400 and set(doc) == {"error"}, doc

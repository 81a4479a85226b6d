"""Residency limits (docs/deployments.md, "Residency limits", "Eviction order", "Operator
actions") over the reference backend on a real waitress server: ``max_loaded`` unloads the least
recently used idle instance, never a pinned one (and refuses with the reason when only pinned
ones hold the room), ``swap`` groups keep one member loaded, ``exclusive`` groups unload what is
outside them except ``persistent`` members, an instance with live handoffs is waited for at most
``handoff_wait``, then unloaded with its handoffs expired (410); operator actions load, unload, pin and unpin (a client key gets 403 in the protocol's
shape); log tails hold no path, key or pid; ``/v1/models`` and ``/api/ps`` show the status.
The instances' lifecycles are observed through the same routes operators use.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from werk_host.deployments.profile import ProfileError, parse_profile
from werk_host.server import Host
from werk_host.testing.api import Api
from werk_host.testing.hosts import backend_host, running

CLIENT = "sk-werk-residency-client-0123456789"
OPERATOR = "sk-werk-residency-operator-0123456789"


def _serve(tmp_path: Path, profile: str, **config: Any) -> Generator[tuple[Host, str]]:
    home = tmp_path / "home"
    home.mkdir()
    path = tmp_path / "deployments.toml"
    path.write_text(profile)
    config.setdefault("api_keys", (CLIENT,))
    host, _ = backend_host(home, profile=path, operator_api_keys=(OPERATOR,), **config)
    with running(host) as url:
        yield host, url


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Any]:
    stack: list[Generator[tuple[Host, str]]] = []

    def start(profile: str, **config: Any) -> tuple[Host, str]:
        gen = _serve(tmp_path, profile, **config)
        stack.append(gen)
        return next(gen)

    yield start
    for gen in stack:
        gen.close()


def _chat(api: Api, model: str) -> tuple[int, Any]:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    return api.post("/v1/chat/completions", body)


def _states(api: Api) -> dict[str, str]:
    status, doc = api.get("/werk/v1/deployments")
    assert status == 200, doc
    return {i["id"]: i["state"] for i in doc["data"]["inventory"]}


def _ok(result: tuple[int, Any]) -> Any:
    status, body = result
    assert status == 200, body
    return body


THREE = (
    '[[instance]]\nid = "a"\nmodel = "tiny"\n'
    '[[instance]]\nid = "b"\nmodel = "tiny"\n'
    '[[instance]]\nid = "c"\nmodel = "tiny"\n'
)


def test_max_loaded_unloads_the_least_recently_used_idle_instance(serve: Any) -> None:
    _, url = serve(THREE + "[residency]\nmax_loaded = 2\n")
    api = Api(url, CLIENT)
    _ok(_chat(api, "a"))
    _ok(_chat(api, "b"))
    _ok(_chat(api, "a"))  # b is now the least recently used
    _ok(_chat(api, "c"))
    assert _states(api) == {"a": "ready", "b": "cold", "c": "ready"}
    operator = Api(url, OPERATOR)
    lines = _ok(operator.get("/werk/v1/deployments/b/logs"))["data"]["lines"]
    assert any("unloaded to load c (max_loaded 2)" in line for line in lines), lines


def test_the_command_line_limit_replaces_the_profiles(serve: Any) -> None:
    _, url = serve(THREE + "[residency]\nmax_loaded = 3\n", max_loaded=1)
    api = Api(url, CLIENT)
    _ok(_chat(api, "a"))
    _ok(_chat(api, "b"))
    assert _states(api) == {"a": "cold", "b": "ready", "c": "cold"}


def test_a_pinned_instance_is_never_unloaded_and_a_refusal_names_why(serve: Any) -> None:
    profile = THREE.replace('id = "a"\nmodel = "tiny"\n', 'id = "a"\nmodel = "tiny"\npin = true\n')
    _, url = serve(profile + "[residency]\nmax_loaded = 2\n")
    api, operator = Api(url, CLIENT), Api(url, OPERATOR)
    _ok(_chat(api, "a"))
    _ok(_chat(api, "b"))
    _ok(_chat(api, "c"))  # a is older, but pinned: b goes
    assert _states(api) == {"a": "ready", "b": "cold", "c": "ready"}
    _ok(operator.post("/werk/v1/deployments/c/actions", {"action": "pin"}))
    status, body = _chat(api, "b")
    assert status == 429 and body["error"]["code"] == "resource_exhausted", body
    assert "max_loaded 2" in body["error"]["message"] and "pinned" in body["error"]["message"], body
    doc = _ok(operator.post("/werk/v1/deployments/a/actions", {"action": "unpin"}))["data"]
    assert doc["action"] == "unpin" and doc["instance"]["pinned"] is False
    assert _states(api)["b"] == "failed"  # refused, with the reason in the inventory; the next use tries again
    doc = _ok(operator.post("/werk/v1/deployments/b/actions", {"action": "load"}))["data"]
    assert doc["instance"]["state"] == "ready"
    assert _states(api) == {"a": "cold", "b": "ready", "c": "ready"}


def test_a_swap_group_keeps_one_member_loaded(serve: Any) -> None:
    _, url = serve(THREE + '[group.pair]\nmembers = ["a", "b"]\nswap = true\n')
    api = Api(url, CLIENT)
    _ok(_chat(api, "c"))
    _ok(_chat(api, "a"))
    _ok(_chat(api, "b"))
    assert _states(api) == {"a": "cold", "b": "ready", "c": "ready"}
    _ok(_chat(api, "a"))
    assert _states(api) == {"a": "ready", "b": "cold", "c": "ready"}


def test_an_exclusive_group_unloads_all_outside_it_but_persistent_members(serve: Any) -> None:
    four = THREE + '[[instance]]\nid = "d"\nmodel = "tiny"\n'
    groups = '[group.big]\nmembers = ["a"]\nexclusive = true\n[group.keep]\nmembers = ["d"]\npersistent = true\n'
    _, url = serve(four + groups)
    api = Api(url, CLIENT)
    for name in ("b", "c", "d"):
        _ok(_chat(api, name))
    _ok(_chat(api, "a"))
    assert _states(api) == {"a": "ready", "b": "cold", "c": "cold", "d": "ready"}


def test_an_instance_with_a_live_handoff_is_waited_for_then_the_wait_ends_in_503(serve: Any) -> None:
    profile = THREE + '[group.pair]\nmembers = ["a", "b"]\nswap = true\n[residency]\nload_timeout = 1\n'
    _, url = serve(profile)
    api = Api(url, CLIENT)
    body = {"model_id": "tiny", "input": {"type": "text", "text": "kept"}, "allow_experimental": True}
    handoff = _ok(api.post("/werk/v1/prefill", {**body, "policy": {"mode": "ephemeral"}}))["data"]["handoff"]
    for path, shape in (("/v1/chat/completions", "openai"), ("/api/chat", "ollama"), ("/v1/messages", "anthropic")):
        status, headers, answer = _raw_chat(url, path, "b")
        busy = 529 if shape == "anthropic" else 503  # Anthropic's "overloaded" (compat.md)
        assert status == busy and headers.get("Retry-After", "").isdigit(), (path, answer)
        message = answer["error"] if shape == "ollama" else answer["error"]["message"]
        assert "waiting for a to go idle" in message, (path, answer)
    assert _states(api) == {"a": "ready", "b": "cold", "c": "cold"}
    _ok(api.post("/werk/v1/decode", {"handoff": handoff, "max_tokens": 2, "allow_experimental": True}))
    _ok(_chat(api, "b"))  # the handoff is redeemed: a is idle and goes
    assert _states(api) == {"a": "cold", "b": "ready", "c": "cold"}


OTHER = "sk-werk-residency-other-client-0123456789"


def test_past_handoff_wait_another_key_swaps_the_instance_and_the_idle_handoff_expires(serve: Any) -> None:
    """Key A's unredeemed handoff keeps instance a loaded for ``handoff_wait`` only: key B's
    request for b (same swap group) then unloads a, and A's decode answers 410."""
    profile = (
        THREE + '[group.pair]\nmembers = ["a", "b"]\nswap = true\n[residency]\nload_timeout = 30\nhandoff_wait = "1s"\n'
    )
    host, url = serve(profile, api_keys=(CLIENT, OTHER))
    owner, other = Api(url, CLIENT), Api(url, OTHER)
    body = {"model_id": "tiny", "input": {"type": "text", "text": "kept"}, "allow_experimental": True}
    handoff = _ok(owner.post("/werk/v1/prefill", {**body, "policy": {"mode": "ephemeral"}}))["data"]["handoff"]
    assert host.service.handoffs.live_count() == 1
    _ok(_chat(other, "b"))  # waits handoff_wait (1 s), not load_timeout (30 s)
    assert _states(owner) == {"a": "cold", "b": "ready", "c": "cold"}
    assert host.service.handoffs.live_count() == 0  # expired with the process, not left to count
    status, answer = owner.post("/werk/v1/decode", {"handoff": handoff, "max_tokens": 2, "allow_experimental": True})
    assert status == 410 and answer["error"]["code"] == "expired_handoff", answer


def test_handoff_wait_is_checked_in_the_profile() -> None:
    with pytest.raises(ProfileError, match="handoff_wait"):
        parse_profile(THREE + '[residency]\nhandoff_wait = "soon"\n', source="p.toml", known_model=lambda _name: True)
    text = THREE + '[residency]\nhandoff_wait = "2s"\n'
    assert parse_profile(text, source="p.toml", known_model=lambda _name: True).residency.handoff_wait_s == 2.0


def _raw_chat(url: str, path: str, model: str) -> tuple[int, dict[str, str], Any]:
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": False}
    body.update({"options": {"num_predict": 2}} if path == "/api/chat" else {"max_tokens": 2})
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=60)
    try:
        headers = {"Authorization": f"Bearer {CLIENT}", "Content-Type": "application/json", "x-api-key": CLIENT}
        conn.request("POST", path, body=json.dumps(body), headers=headers)
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), json.loads(resp.read())
    finally:
        conn.close()


def test_client_keys_cannot_act_and_bad_actions_are_typed_4xx(serve: Any) -> None:
    _, url = serve(THREE)
    api, operator = Api(url, CLIENT), Api(url, OPERATOR)
    for action in ("load", "unload", "pin", "unpin"):
        status, body = api.post("/werk/v1/deployments/a/actions", {"action": action})
        assert status == 403 and body["error"]["code"] == "forbidden" and "operator" in body["error"]["message"]
    status, body = api.get("/werk/v1/deployments/a/logs")
    assert status == 403 and body["error"]["code"] == "forbidden", body
    assert operator.post("/werk/v1/deployments/a/actions", {"action": "explode"})[0] == 400
    assert operator.post("/werk/v1/deployments/a/actions", {"action": "load", "x": 1})[0] == 400
    assert operator.post("/werk/v1/deployments/nope/actions", {"action": "load"})[0] == 404
    assert operator.get("/werk/v1/deployments/a/logs", lines=0)[0] == 400
    assert operator.get("/werk/v1/deployments/a/logs", lines="many")[0] == 400
    assert _states(api)["a"] == "cold"


def test_operator_load_unload_and_logs_without_paths_keys_or_pids(serve: Any) -> None:
    _, url = serve(THREE)
    operator = Api(url, OPERATOR)
    doc = _ok(operator.post("/werk/v1/deployments/a/actions", {"action": "load"}))["data"]["instance"]
    assert doc["state"] == "ready" and doc["load_seconds"] is not None and doc["state_since_unix_ms"] is not None
    doc = _ok(operator.post("/werk/v1/deployments/a/actions", {"action": "unload"}))["data"]["instance"]
    assert doc["state"] == "cold"
    lines = _ok(operator.get("/werk/v1/deployments/a/logs"))["data"]["lines"]
    assert [line.split(" ", 1)[1] for line in lines][:2] == ["loading", lines[1].split(" ", 1)[1]]
    assert lines[1].split(" ", 1)[1].startswith("ready in ")
    assert lines[-1].endswith("unloaded: unloaded by an operator")
    text = "\n".join(lines)
    assert "/" not in text  # no filesystem path
    assert OPERATOR not in text and CLIENT not in text and "pid" not in text.lower()
    assert _ok(operator.get("/werk/v1/deployments/a/logs"))["data"]["backend_lines"] is None  # nothing runs


def test_the_logs_add_the_backends_own_tail_redacted_and_apart(serve: Any) -> None:
    """``backend_lines`` (the backend's ``werk_log_tail``) beside Werk's events, while the
    instance is loaded: a path, a key and a process id the backend wrote never reach the operator."""
    host, url = serve(THREE)
    operator = Api(url, OPERATOR)
    _ok(_chat(Api(url, CLIENT), "a"))
    deployments = host.fleet.deployments
    assert deployments is not None
    adapter = deployments.instances["a"].peek()
    assert adapter is not None
    adapter.native_log += [f"model file /srv/models/a.gguf key {OPERATOR} pid 4242", "serving"]
    doc = _ok(operator.get("/werk/v1/deployments/a/logs", lines=3))["data"]
    assert doc["backend_lines"] == ["ran chat", "model file <path> key [redacted] pid <pid>", "serving"], doc
    assert doc["lines"][-1].split(" ", 1)[1].startswith("ready in ")  # Werk's own events, apart
    assert not any("ran chat" in line for line in doc["lines"])


def test_models_and_ps_show_the_status(serve: Any) -> None:
    _, url = serve(THREE)
    api = Api(url, CLIENT)
    _ok(_chat(api, "b"))
    models = {m["id"]: m for m in _ok(api.get("/v1/models"))["data"]}
    assert models["a"]["status"] == "unloaded" and models["b"]["status"] == "ready"
    assert isinstance(models["b"]["status_since_unix_ms"], int)
    running = _ok(api.get("/api/ps"))["models"]
    assert [(m["name"], m["status"]) for m in running] == [("b", "ready")]
    assert running[0]["status_since"].endswith("Z")


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("[residency]\nmax_loaded = 0\n", "residency.max_loaded"),
        ('[residency]\nmax_loaded = "2"\n', "residency.max_loaded"),
        ("[residency]\nload_timeout = 0\n", "residency.load_timeout"),
        ('[residency]\nload_timeout = "forever"\n', "residency.load_timeout"),
        ("[residency]\nmax_load = 2\n", "residency.max_load"),
        ('[group.g]\nmembers = ["zz"]\n', "group.g.members[0]"),
        ("[group.g]\nmembers = []\n", "group.g.members"),
        ('[group.g]\nmembers = ["a"]\nswap = "yes"\n', "group.g.swap"),
        ('[group.g]\nmembers = ["a"]\nswap = true\nmax_loaded = 2\n', "group.g.max_loaded"),
        ('[group.g]\nmembers = ["a"]\n[group.h]\nmembers = ["a"]\n', "group.h.members[0]"),
        ('[group.a]\nmembers = ["b"]\n', "group.a"),
    ],
)
def test_bad_residency_tables_name_the_field(text: str, field: str) -> None:
    with pytest.raises(ProfileError) as err:
        parse_profile(THREE + text, source="p.toml", known_model=lambda _name: True)
    assert err.value.field == field, str(err.value)


@pytest.mark.parametrize(
    ("value", "field"), [('"8GB"', "memory"), ("0", "memory"), ('"yes"', "pin"), ('"x"', "memory")]
)
def test_bad_instance_residency_keys_name_the_field(value: str, field: str) -> None:
    text = f'[[instance]]\nid = "a"\nmodel = "tiny"\n{field} = {value}\n'
    with pytest.raises(ProfileError) as err:
        parse_profile(text, source="p.toml", known_model=lambda _name: True)
    assert err.value.field == f"instance[0].{field}", str(err.value)


def test_memory_sizes_parse() -> None:
    text = '[[instance]]\nid = "a"\nmodel = "tiny"\nmemory = "1.5GiB"\npin = true\n'
    spec = parse_profile(text, source="p.toml", known_model=lambda _name: True).instances[0]
    assert spec.memory_bytes == 3 << 29 and spec.pin is True

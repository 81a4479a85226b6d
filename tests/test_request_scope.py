"""Each request's instance is resolved once and passed explicitly (werk_host/service/scope.py).

Concurrent requests on a real server, half for one instance and half for the other, each see
only their own instance while a slow backend hook keeps them overlapping; the instance a
request uses counts in flight exactly while it runs (one mechanism); and no selection lives in
a context variable anywhere in the service or HTTP layers.
"""

from __future__ import annotations

import ast
import http.client
import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from werk_host.config import HostConfig
from werk_host.models import ModelManifest, ModelRegistry
from werk_host.plugin import hookimpl
from werk_host.pluginhost import PluginHost
from werk_host.protocol import ChatLimits
from werk_host.server import Host, build_host
from werk_host.service.scope import RequestScope
from werk_host.testing.hosts import running
from werk_host.testing.reference import BACKEND_ID, MemoryAdapter, MemoryBackendPlugin

KEY = "sk-werk-scope-test-0042"
ROOT = Path(__file__).resolve().parents[1]
PROFILE = """
[[instance]]
id = "a"
model = "alpha"
preload = true
default = true

[[instance]]
id = "b"
model = "beta"
preload = true
"""
CONTEXT = {"alpha": 1000, "beta": 2000}
#: how long the backend takes to answer its limits: long enough for requests to overlap
SLOW_S = 0.02


class SlowLimits(MemoryAdapter):
    """The reference adapter whose limits take a while and name its own model."""

    @hookimpl(specname="werk_chat_limits")
    def chat_limits(self, model: str | None) -> ChatLimits:
        time.sleep(SLOW_S)
        return ChatLimits(
            model=self.model_name,
            context_tokens=CONTEXT[self.model_name],
            max_output_tokens=32,
            max_concurrent_requests=4,
        )


class SlowPlugin(MemoryBackendPlugin):
    adapter_class = SlowLimits


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Host]]:
    home = tmp_path / "home"
    home.mkdir()
    for name in CONTEXT:
        weights = tmp_path / f"{name}.bin"
        weights.write_bytes(f"weights of {name}".encode())
        ModelRegistry(home).add(ModelManifest.from_paths(name, [weights], backend=BACKEND_ID))
    profile = tmp_path / "deployments.toml"
    profile.write_text(PROFILE)
    plugins = PluginHost()
    plugins.register(SlowPlugin(), "testbackend")
    host = build_host(HostConfig(home=home, api_keys=(KEY,), profile=profile), plugins=plugins)
    with running(host) as url:
        yield url, host


def get(url: str, path: str, deployment: str | None = None) -> tuple[int, dict[str, Any]]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=30)
    headers = {"Authorization": f"Bearer {KEY}"}
    if deployment is not None:
        headers["X-Werk-Deployment"] = deployment
    try:
        conn.request("GET", path, headers=headers)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def test_concurrent_requests_for_two_instances_never_see_each_others(served: tuple[str, Host]) -> None:
    url, _ = served
    wanted = ["a", "b"] * 24
    expect = {"a": ("alpha", 1000), "b": ("beta", 2000)}

    def limits(instance: str) -> tuple[str, str, int]:
        status, body = get(url, "/werk/v1/chat/limits", instance)
        assert status == 200, body
        return instance, body["data"]["model"], body["data"]["context_tokens"]

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(limits, wanted))
    elapsed = time.monotonic() - started
    assert elapsed < len(wanted) * SLOW_S, "the requests did not overlap"
    for instance, model, context in answers:
        assert (model, context) == expect[instance], f"a request for {instance} saw {model}"
    # the default instance without the header, and each instance's own capability listing
    assert get(url, "/werk/v1/chat/limits")[1]["data"]["model"] == "alpha"
    assert get(url, "/werk/v1/info", "b")[0] == 200


def test_a_request_enters_each_instance_it_uses_once_and_releases_them_all(served: tuple[str, Host]) -> None:
    url, host = served
    deployments = host.fleet.deployments
    assert deployments is not None
    a, b = deployments.instances["a"], deployments.instances["b"]
    assert (a.in_flight, b.in_flight) == (0, 0)
    scope = RequestScope(host_principal(host), b)
    assert scope.started() is b.peek() and b.in_flight == 1
    other = scope.on(a)
    assert other.started() is a.peek() and (a.in_flight, b.in_flight) == (1, 1)
    assert scope.started() is b.peek() and b.in_flight == 1, "an instance is entered once per request"
    scope.close()
    scope.close()
    assert (a.in_flight, b.in_flight) == (0, 0), "closing the request releases every instance it used"


def host_principal(host: Host) -> Any:
    principal = host.auth.authenticate(KEY)
    assert principal is not None
    return principal


def test_selection_lives_in_no_context_variable() -> None:
    """Service and HTTP code create no ``ContextVar`` (the request scope is an argument)."""
    found: list[str] = []
    for layer in ("service", "http", "compat"):
        for file in sorted((ROOT / "werk_host" / layer).rglob("*.py")):
            for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Call):
                    name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                    if name == "ContextVar":
                        found.append(f"{file.relative_to(ROOT)}:{node.lineno}")
    assert not found, found

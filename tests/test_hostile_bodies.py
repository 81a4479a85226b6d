"""Hostile bodies on the routes outside the OpenAPI document, against the reference backend.

The corpus and checker are :mod:`werk_host.testing.hostile` (the llama.cpp plugin's suite
runs the same corpus against a real llama-server): for every case the reply is below 500, an
error is in the route family's own shape (OpenAI, Anthropic, Ollama; docs/compat.md) and
leaks nothing (no traceback, path, process id, key or backend text). After every Ollama
generation case ``/api/ps`` must still answer (a stored ``keep_alive`` must not break it).
A bounded Hypothesis part sends generated bodies; ``WERK_FUZZ_EXAMPLES`` raises its count.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from falcon.inspect import inspect_routes
from hypothesis import HealthCheck, given, settings

import werk_host
from tests.conftest import KEY
from werk_host.server import Host
from werk_host.testing import hostile
from werk_host.testing.hosts import MODEL, backend_host, running
from werk_host.testing.reference import MemoryBackendPlugin

EXAMPLES = int(os.environ.get("WERK_FUZZ_EXAMPLES", "25")) * 8
REPO = str(Path(werk_host.__file__).resolve().parent.parent)


class Target:
    def __init__(self, base: str, leaks: hostile.Leaks) -> None:
        self.base = base
        self.leaks = leaks

    def check(self, case: hostile.Case) -> list[str]:
        reply = hostile.send(self.base, KEY, case)
        found = hostile.problems(case, reply, self.leaks)
        if case.route.path in ("/api/chat", "/api/generate"):
            after = hostile.send(self.base, KEY, hostile.Case("GET /api/ps", _route("/api/ps"), None))
            if after.status != 200:
                found.append(f"/api/ps answered {after.status} {after.body[:200]!r} after it")
        if found:
            return [f"{case.name}: {found} -> {reply.status} {reply.body[:300]!r}"]
        return []


def _route(path: str) -> hostile.Route:
    return next(r for r in hostile.routes(MODEL) if r.path == path)


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    home = tmp_path_factory.mktemp("hostile") / "werk-home"
    home.mkdir()
    host, _ = backend_host(home, api_keys=(KEY,))
    leaks = hostile.Leaks(secrets=(KEY,), paths=(str(home.parent), REPO), pids=(os.getpid(),))
    with running(host) as base:
        yield Target(base, leaks)


@pytest.mark.parametrize("path", [r.path for r in hostile.routes(MODEL)])
def test_hostile_corpus_gets_typed_client_errors(target: Target, path: str) -> None:
    cases = hostile.corpus(MODEL, only=[path])
    assert len(cases) >= 40
    failures = [failure for case in cases for failure in target.check(case)]
    assert not failures, f"{len(failures)} of {len(cases)} cases failed:\n" + "\n".join(failures[:40])


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(case=hostile.strategies(MODEL))
def test_generated_bodies_get_typed_client_errors(target: Target, case: hostile.Case) -> None:
    assert not target.check(case)


def test_the_checker_sees_every_kind_of_defect() -> None:
    """The checker itself: each defect it exists for is reported, and a clean reply is not."""
    leaks = hostile.Leaks(secrets=(KEY,), paths=("/srv/werk-home",), pids=(4242,))
    ollama, anthropic, openai = _route("/api/chat"), _route("/v1/messages"), _route("/v1/chat/completions")
    refused = hostile.Case("refused", openai, b"{", refuse=True)

    def seen(case: hostile.Case, status: int, body: bytes, content_type: str = "application/json") -> list[str]:
        return hostile.problems(case, hostile.Reply(status, content_type, body), leaks)

    assert seen(hostile.Case("ok", ollama, b"{}"), 400, b'{"error": "bad model"}') == []
    assert (
        seen(hostile.Case("ok", anthropic, b"{}"), 400, b'{"type": "error", "error": {"type": "x", "message": "m"}}')
        == []
    )
    assert seen(refused, 400, b'{"error": {"message": "m", "type": "invalid_request_error"}}') == []
    assert seen(refused, 200, b"{}") == ["an invalid request was accepted (200)"]
    assert seen(hostile.Case("5xx", ollama, b"{}"), 502, b'{"error": "x"}') == ["server error 502"]
    assert seen(hostile.Case("shape", ollama, b"{}"), 400, b'{"error": {"message": "m"}}')
    assert seen(hostile.Case("shape", anthropic, b"{}"), 400, b'{"error": {"message": "m", "type": "t"}}')
    assert seen(hostile.Case("text", openai, b"{}"), 400, b"Bad Request", "text/plain")
    for leaked in (KEY, "/srv/werk-home/states", "pid 4242", 'File "x.py", line 3', "[json.exception.type_error.302]"):
        body = json.dumps({"error": f"failed: {leaked}"}).encode()
        assert seen(hostile.Case("leak", ollama, b"{}"), 400, body), leaked
    assert seen(hostile.Case("no pid", ollama, b"{}"), 400, b'{"error": "req_42420 took 14242 ms"}') == []


def test_the_corpus_covers_every_compat_route(test_host: tuple[Host, MemoryBackendPlugin]) -> None:
    served = {route.path for route in inspect_routes(test_host[0].app)}
    # the image and speech routes have their own corpus over media backends: tests/media/test_media_hostile.py
    media = ("/v1/images/", "/v1/audio/")
    compat = {path for path in served if path.startswith(("/v1/", "/api/")) and not path.startswith(media)}
    assert compat == {route.path for route in hostile.routes(MODEL)}

"""Fuzzing against a real llama-server: schemathesis with real values, and the hostile-body corpus.

The reference adapter alone misses what only a real backend does (its chat template, its token
counts, its own error text), so both fuzzing suites of the host run here again, on a Werk host
with two keys over a real llama-server serving the tiny generated model:

* schemathesis (as the host's tests/test_openapi_fuzz.py) reads ``/openapi.json`` and sends
  generated requests to every ``/werk/v1`` operation, with the served model id, a state
  committed before the run and a handoff from a real prefill (tests/schemathesis.toml lists
  every expected status with its reason);
* the corpus of :mod:`werk_host.testing.hostile` on the ``/v1``, ``/v1/messages`` and ``/api``
  routes: below 500, the route family's error shape, no traceback, path, process id (the
  host's or llama-server's), key or raw llama-server text.

``WERK_FUZZ_EXAMPLES`` raises the example counts.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
from hypothesis import HealthCheck, given, settings

import werk_host.plugin
from werk_host.plugin import HostConfig, ModelManifest
from werk_host.testing import hostile
from werk_host.testing.api import Api
from werk_host.testing.host import Host, ModelRegistry, build_host
from werk_host.testing.hosts import running

pytestmark = pytest.mark.llamaserver
KEY = "sk-werk-llama-fuzz-0123456789"
OTHER_KEY = "sk-werk-llama-fuzz-other-98765"
MODEL = "tiny"
CONFIG = Path(__file__).with_name("schemathesis.toml")
EXAMPLES = int(os.environ.get("WERK_FUZZ_EXAMPLES", "5"))
STRIDE = max(1, 50 // EXAMPLES)
REPO = str(Path(werk_host.plugin.__file__).resolve().parents[2])


def _host(home: Path, server: Path, model: Path) -> Host:
    home.mkdir(parents=True, exist_ok=True)
    ModelRegistry(home).add(
        ModelManifest.from_paths(MODEL, [model], backend="llama.cpp", params={"max_output_tokens": 64})
    )
    return build_host(
        HostConfig(
            home=home,
            api_keys=(KEY, OTHER_KEY),
            model=MODEL,
            backend_options={"llamacpp": {"llama_server": str(server), "parallel": 2, "ctx": 4096}},
        )
    )


@dataclass
class Live:
    base: str
    api: Api
    leaks: hostile.Leaks

    def check(self, case: hostile.Case) -> list[str]:
        reply = hostile.send(self.base, KEY, case)
        found = hostile.problems(case, reply, self.leaks)
        if case.route.path in ("/api/chat", "/api/generate"):
            status, body = self.api.get("/api/ps")
            if status != 200:
                found.append(f"/api/ps answered {status} {body} after it")
        if found:
            return [f"{case.name}: {found} -> {reply.status} {reply.body[:300]!r}"]
        return []


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, llama_server_path: Path, tiny_model: Path) -> Iterator[Live]:
    home = tmp_path_factory.mktemp("fuzz") / "home"
    host = _host(home, llama_server_path, tiny_model)
    with running(host) as base:
        api = Api(base, KEY)
        status, body = api.post(
            "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        )
        assert status == 200, body  # llama-server is up: its process id is known below
        pids = (os.getpid(), *(child.pid for child in psutil.Process().children(recursive=True)))
        assert len(pids) > 1, "llama-server runs as a child process"
        paths = (str(home.parent), REPO, str(llama_server_path), str(tiny_model.parent))
        yield Live(base, api, hostile.Leaks(secrets=(KEY, OTHER_KEY), paths=paths, pids=pids))


@pytest.mark.parametrize("path", [r.path for r in hostile.routes(MODEL)])
def test_hostile_corpus_on_a_real_llama_server(live: Live, path: str) -> None:
    # Cases refused on their face never reach llama-server (the host's own suite runs them all):
    # one in STRIDE of them here, every one from WERK_FUZZ_EXAMPLES=50 up.
    cases = [c for i, c in enumerate(hostile.corpus(MODEL, only=[path])) if not c.refuse or i % STRIDE == 0]
    failures = [failure for case in cases for failure in live.check(case)]
    assert not failures, f"{len(failures)} of {len(cases)} cases failed:\n" + "\n".join(failures[:40])


@settings(
    max_examples=EXAMPLES * 10,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(case=hostile.strategies(MODEL))
def test_generated_bodies_on_a_real_llama_server(live: Live, case: hostile.Case) -> None:
    assert not live.check(case)


def test_llama_server_survived_the_corpus(live: Live) -> None:
    children = {child.pid for child in psutil.Process().children(recursive=True)}
    assert set(live.leaks.pids[1:]) <= children  # the same llama-server, never restarted
    status, body = live.api.post(
        "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    )
    assert status == 200, body


def _schemathesis() -> str:
    found = shutil.which("schemathesis", path=str(Path(sys.executable).parent)) or shutil.which("schemathesis")
    if found is None:
        pytest.fail("schemathesis is not installed: it is part of werk-host's test extra")
    return found


def _data(result: tuple[int, dict[str, Any]]) -> dict[str, Any]:
    status, body = result
    assert status == 200, body
    data: dict[str, Any] = body["data"]
    return data


def test_schemathesis_with_real_values_finds_no_undocumented_status(
    tmp_path: Path, llama_server_path: Path, tiny_model: Path
) -> None:
    host = _host(tmp_path / "home", llama_server_path, tiny_model)
    with running(host) as base:
        api = Api(base, KEY)
        text = "a state committed before the fuzzing run: " + " ".join(f"w{i}" for i in range(40))
        prefill = {"model_id": MODEL, "policy": {"mode": "disk"}, "allow_experimental": True}
        state = _data(api.post("/werk/v1/prefill", {**prefill, "input": {"type": "text", "text": text}}))
        handoff = _data(api.post("/werk/v1/prefill", {**prefill, "input": {"type": "text", "text": "hello"}}))
        listed = _data(api.get("/werk/v1/states"))["states"]
        assert state["state_id"] in [s["id"] for s in listed]
        result = subprocess.run(
            [
                _schemathesis(),
                "--config-file",
                str(CONFIG),
                "run",
                f"{base}/openapi.json",
                "--header",
                f"Authorization: Bearer {KEY}",
                "--max-examples",
                str(EXAMPLES),
                "--seed",
                "20261201",
                "--workers",
                "1",
                "--request-timeout",
                "60",
            ],
            capture_output=True,
            text=True,
            timeout=900,
            cwd=tmp_path,  # schemathesis may write reports next to where it runs
            env={
                **os.environ,
                "SCHEMATHESIS_HOOKS": "",
                "WERK_FUZZ_STATE_ID": state["state_id"],
                "WERK_FUZZ_HANDOFF": handoff["handoff"],
            },
        )
        # The real values were used: the run decoded the handoff (same process), so it is spent.
        spent = api.post("/werk/v1/decode", {"handoff": handoff["handoff"], "allow_experimental": True})
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    counts = re.search(r"(\d+) generated, (\d+) passed", output)
    assert counts is not None and int(counts.group(2)) >= 10 * EXAMPLES, output[-2000:]
    assert KEY not in output
    assert spent[0] == 410, spent

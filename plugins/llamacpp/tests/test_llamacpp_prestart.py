"""A second ``werk serve`` of the same command spawns the llama-server its first start planned
before the host is imported, and the plugin adopts it only when its own plan is that child
(docs/operations.md, "Remembered launches"). Real ``werk serve`` processes, a real llama-server.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil  # type: ignore[import-untyped]
import pytest
from test_llamacpp_orphans import llama_children, werk_serve
from test_llamacpp_werk import install

from werk_host.testing.api import Api
from werk_host.testing.processes import gone, prestart_unavailable

pytestmark = [
    pytest.mark.llamaserver,
    pytest.mark.skipif(prestart_unavailable() is not None, reason=str(prestart_unavailable())),
]

ADOPTED = "adopted the child started from the remembered launch"
DIFFERS = "the remembered launch differs from this start's plan"


def answers(api: Api) -> None:
    status, body = api.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert status == 200, body


def logged(tmp_path: Path) -> str:
    return (tmp_path / "werk-serve.log").read_text()


def stop(serve: subprocess.Popen[str]) -> None:
    serve.send_signal(signal.SIGTERM)
    assert serve.wait(timeout=60) == 0


@pytest.fixture
def home(tmp_path: Path, llama_server_path: Path, tiny_model: Path) -> Path:
    """A home whose ``werk serve --model tiny`` started once: its launch is remembered."""
    home = tmp_path / "home"
    home.mkdir()
    install(home, tiny_model)
    with werk_serve(home, llama_server_path) as (serve, api):
        answers(api)
        stop(serve)
    return home


def test_the_second_start_adopts_the_child_spawned_from_the_first_starts_plan(
    tmp_path: Path, home: Path, llama_server_path: Path
) -> None:
    memo = json.loads((home / "launches" / "v1.json").read_text())
    (entry,) = memo["launches"].values()
    assert entry["name"] == "llama-server" and entry["env_set"] == {"LLAMA_API_KEY": [{"$": "secret"}]}
    assert ADOPTED not in logged(tmp_path)

    with werk_serve(home, llama_server_path) as (serve, api):
        (child,) = llama_children(serve.pid)
        (run_dir,) = (home / "backends" / "llamacpp").glob("gen-*")
        record = json.loads((run_dir / "child.json").read_text())
        assert record["pid"] == child.pid  # one child, the one its run directory records
        answers(api)
        assert logged(tmp_path).count(ADOPTED) == 1
        stop(serve)
    assert gone(child.pid)
    assert not list((home / "backends" / "llamacpp").glob("gen-*"))


def test_a_plan_that_changed_kills_the_prestarted_child_and_starts_its_own(
    tmp_path: Path, home: Path, llama_server_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # llama-server reads LLAMA_ARG_* itself; Werk's plan strips them from the child's
    # environment, the remembered launch (spawned before the plan) keeps them.
    monkeypatch.setenv("LLAMA_ARG_N_PREDICT", "4")
    with werk_serve(home, llama_server_path) as (serve, api):
        answers(api)
        (child,) = llama_children(serve.pid)
        assert "LLAMA_ARG_N_PREDICT" not in child.environ()
        assert logged(tmp_path).count(DIFFERS) == 1 and ADOPTED not in logged(tmp_path)
        stop(serve)
    assert not list((home / "backends" / "llamacpp").glob("gen-*"))
    left = [p for p in psutil.process_iter(["cmdline"]) if str(home) in " ".join(p.info["cmdline"] or ())]
    assert not left, "neither the discarded nor the planned child may outlive werk serve"


def test_werk_run_adopts_the_child_its_last_run_planned_whatever_the_prompt(
    tmp_path: Path, llama_server_path: Path, tiny_model: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    install(home, tiny_model)
    env = {**os.environ, "WERK_HOME": str(home), "WERK_LLAMA_SERVER": str(llama_server_path)}

    def run(prompt: str) -> str:
        argv = [sys.executable, "-m", "werk_host", "run", "tiny", prompt, "--max-tokens", "2", "-v"]
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stderr

    assert ADOPTED not in run("hello")
    assert ADOPTED in run("a prompt of another length")
    assert not list((home / "backends" / "llamacpp").glob("gen-*"))
    left = [p for p in psutil.process_iter(["cmdline"]) if str(home) in " ".join(p.info["cmdline"] or ())]
    assert not left

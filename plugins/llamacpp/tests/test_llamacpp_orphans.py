"""A llama-server child cannot outlive werk serve, cannot be driven without its key, and stale ones are cleaned."""

from __future__ import annotations

import dataclasses
import http.client
import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil  # type: ignore[import-untyped]
import pytest
from llamacpp_fakes import FAKE_HELP, calls, write_fake_server
from test_llamacpp_werk import KEY, config, install
from werk_llamacpp.adapter import LlamaCppAdapter
from werk_llamacpp.process import LlamaServerError, LlamaServerProcess, advertised_env

from werk_host.plugin.process import free_port
from werk_host.testing.api import Api
from werk_host.testing.host import ChildRecord, build_host, hold_owner_lock, write_record
from werk_host.testing.hosts import running
from werk_host.testing.processes import gone

real_server = pytest.mark.llamaserver


def llama_children(pid: int) -> list[psutil.Process]:
    """Live llama-server processes below ``pid``."""
    return [
        c
        for c in psutil.Process(pid).children(recursive=True)
        if c.status() != psutil.STATUS_ZOMBIE and c.name() == "llama-server"
    ]


@contextmanager
def werk_serve(home: Path, llama_server: Path) -> Iterator[tuple[subprocess.Popen[str], Api]]:
    """A real ``werk serve`` process serving the installed model; killed if still running at exit."""
    env = {**os.environ, "WERK_HOME": str(home), "WERK_API_KEYS": KEY, "WERK_LLAMA_SERVER": str(llama_server)}
    log = home.parent / "werk-serve.log"
    with open(log, "ab") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "werk_host", "serve", "--port", "0", "--model", "tiny"],
            stdout=subprocess.PIPE,
            stderr=err,
            env=env,
            text=True,
        )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, f"werk serve did not start:\n{log.read_text()[-3000:]}"
        yield proc, Api(f"http://127.0.0.1:{json.loads(line)['port']}", KEY)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def raw_status(proc: LlamaServerProcess, method: str, path: str, key: str | None = None) -> int:
    """Status of a request straight to the child, as any other local process could send it."""
    assert proc.port is not None
    conn = http.client.HTTPConnection(proc.host, proc.port, timeout=30)
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    body = json.dumps(
        {"prompt": "hi", "content": "hi", "n_predict": 1, "messages": [{"role": "user", "content": "hi"}]}
    )
    try:
        conn.request(method, path, body=body if method == "POST" else None, headers=headers)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


@real_server
def test_sigkilled_werk_serve_takes_its_llama_server_along(
    tmp_path: Path, llama_server_path: Path, tiny_model: Path
) -> None:
    home = tmp_path / "home"
    install(home, tiny_model)
    runs = home / "backends" / "llamacpp"
    with werk_serve(home, llama_server_path) as (serve, api):
        (first,) = llama_children(serve.pid)
        # A restart is spawned while serving a request, on a short-lived request thread's behalf.
        first.kill()
        assert gone(first.pid)
        status, body = api.post(
            "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        )
        assert status == 200, body
        (child,) = llama_children(serve.pid)
        assert child.pid != first.pid
        key = child.environ()["LLAMA_API_KEY"]
        (run_dir,) = runs.glob("gen-*")
        serve.kill()
        serve.wait()
        assert gone(child.pid), "llama-server survived SIGKILL of werk serve"
    assert run_dir.is_dir()  # SIGKILL left it behind ...
    with werk_serve(home, llama_server_path) as (serve, _):
        assert not run_dir.exists()  # ... and the next werk serve removed it
        (fresh,) = runs.glob("gen-*")
        assert fresh != run_dir and llama_children(serve.pid)
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(timeout=30) == 0
    assert key not in (tmp_path / "werk-serve.log").read_text()  # nothing werk serve logged shows the key


@real_server
def test_child_answers_nothing_without_its_key(
    server: LlamaServerProcess, llama_server_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = server.api_key
    for method, path in [
        ("POST", "/completion"),
        ("GET", "/slots"),
        ("POST", "/slots/0?action=erase"),
        ("GET", "/props"),
        ("POST", "/tokenize"),
        ("GET", "/metrics"),
        ("GET", "/v1/models"),
        ("POST", "/v1/chat/completions"),
    ]:
        assert raw_status(server, method, path) == 401, path
        assert raw_status(server, method, path, key="not-the-key") == 401, path
    assert raw_status(server, "GET", "/slots", key=key) == 200
    assert raw_status(server, "GET", "/health") == 200  # public: carries no model data
    # the key stays secret: not in the argv every user can read, nor in anything Werk shows or logs
    assert len(key) >= 32
    assert not any(key in arg for arg in psutil.Process(server.pid).cmdline())
    assert psutil.Process(server.pid).environ()["LLAMA_API_KEY"] == key  # readable by this user only
    assert key not in repr(server) and key not in repr(server.client)
    assert key not in json.dumps(server.fingerprints()) + server.args_hash + " ".join(server.argv)
    assert key not in server.log_tail(10_000)
    assert server.run_dir is not None and key not in (server.run_dir / "child.json").read_text()
    # an inherited LLAMA_API_KEY is not passed on: each child gets a fresh key of its own
    monkeypatch.setenv("LLAMA_API_KEY", "sk-inherited-from-the-environment")
    with LlamaServerProcess(tiny_model, binary=llama_server_path, ctx=512, env_args="") as other:
        assert other.api_key not in (key, "sk-inherited-from-the-environment")
        assert raw_status(other, "GET", "/slots", key="sk-inherited-from-the-environment") == 401
        assert raw_status(other, "GET", "/slots", key=key) == 401
        assert raw_status(other, "GET", "/slots", key=other.api_key) == 200


@real_server
def test_capabilities_do_not_expose_the_child_pid(tmp_path: Path, llama_server_path: Path, tiny_model: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    install(home, tiny_model)
    host = build_host(config(home, llama_server_path))
    with running(host) as base:
        api = Api(base, KEY)
        adapter = host.fleet.adapter
        assert isinstance(adapter, LlamaCppAdapter)
        proc = adapter.current()
        assert proc is not None and proc.pid is not None
        status, body = api.get("/werk/v1/capabilities")
        assert status == 200
        details = " ".join(str(c.get("detail")) for c in body["data"])
        assert "managed llama-server" in details
        assert str(proc.pid) not in details and "pid" not in details
        # Werk's own authenticated calls to the child still work (workers() reads /slots)
        status, body = api.get("/werk/v1/observability")
        assert status == 200 and body["data"]["workers"][0]["slots"] == 2


@real_server
def test_a_starting_adapter_stops_the_stale_children_it_owns(
    tmp_path: Path, llama_server_path: Path, tiny_model: Path, caplog: pytest.LogCaptureFixture
) -> None:
    home = tmp_path / "home"
    install(home, tiny_model)
    runs = home / "backends" / "llamacpp"

    def leftover(name: str, record: ChildRecord) -> Path:
        """The run directory of an owner that died: its lock released, its record still there."""
        path = runs / name
        path.mkdir(parents=True, mode=0o700)
        os.close(hold_owner_lock(path))
        write_record(path, record)
        return path

    # A llama-server that survived its owner (started here without any death guard) ...
    stale_slots = tmp_path / "stale-slots"
    stale_slots.mkdir()
    stale = subprocess.Popen(
        [str(llama_server_path), "-m", str(tiny_model), "--port", str(free_port()), "-c", "256",
         "--slot-save-path", str(stale_slots)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    # ... and an unrelated process that has the pid a record names, but is not the recorded one.
    sleeper = int(subprocess.run(["sh", "-c", "sleep 300 >/dev/null 2>&1 & echo $!"], capture_output=True,
                                 text=True, check=True).stdout)  # fmt: skip
    try:
        stale_record, sleeper_record = ChildRecord.of(stale.pid), ChildRecord.of(sleeper)
        assert stale_record is not None and sleeper_record is not None
        stale_dir = leftover("gen-0stale", stale_record)
        reused = [
            leftover("gen-1reused", dataclasses.replace(sleeper_record, create_time=sleeper_record.create_time - 100)),
            leftover("gen-2reused", dataclasses.replace(sleeper_record, cmdline=("sleep", "301"))),
        ]
        with caplog.at_level(logging.INFO, logger="werk_host.backends.records"):
            host = build_host(config(home, llama_server_path))
        try:
            # stopped by SIGTERM, no SIGKILL needed: a loaded server exits 0, a loading one dies of it
            assert stale.wait(timeout=5) in (0, -signal.SIGTERM)
            assert not stale_dir.exists() and not any(p.exists() for p in reused)
            assert not gone(sleeper, timeout=0.3)  # never signalled
            adapter = host.fleet.adapter
            assert isinstance(adapter, LlamaCppAdapter)
            own = adapter.current()
            assert own is not None and own.run_dir is not None
            assert list(runs.glob("gen-*")) == [own.run_dir]
        finally:
            host.close()
        cleaned = [r.getMessage() for r in caplog.records if r.name == "werk_host.backends.records"]
        assert len(cleaned) == 3
        assert sum(f"pid {stale.pid}" in line for line in cleaned) == 1
    finally:
        if stale.poll() is None:
            stale.kill()
            stale.wait()
        os.kill(sleeper, signal.SIGKILL)


def test_the_api_key_variable_is_read_from_the_help() -> None:
    assert advertised_env(FAKE_HELP, "--api-key") == "LLAMA_API_KEY"
    assert advertised_env(FAKE_HELP, "--threads") == "LLAMA_ARG_THREADS"
    assert advertised_env(FAKE_HELP, "-t") == "LLAMA_ARG_THREADS"
    assert advertised_env(FAKE_HELP, "--ctx-size") is None  # no note for that option
    assert advertised_env(FAKE_HELP, "--missing") is None


@pytest.mark.parametrize(
    "help_text",
    [
        FAKE_HELP.replace("(env: LLAMA_API_KEY)", ""),  # --api-key, but no environment variable
        FAKE_HELP.replace("(env: LLAMA_API_KEY)", "(env: LLAMA_ARG_API_KEY)"),  # another one
        "\n".join(line for line in FAKE_HELP.splitlines() if "API key" not in line and "LLAMA_API_KEY" not in line),
    ],
)
def test_a_runtime_that_cannot_take_the_key_from_the_environment_is_never_started(
    tmp_path: Path, help_text: str
) -> None:
    fake = write_fake_server(tmp_path / "bin", help_text=help_text)
    proc = LlamaServerProcess(tmp_path / "m.gguf", binary=fake, env_args="", work_dir=tmp_path / "w")
    with pytest.raises(LlamaServerError, match="without an API key"):
        proc.start()
    assert proc.pid is None and calls(fake) == ["--help", "--version"]  # never spawned
    assert list((tmp_path / "w").iterdir()) == []  # and its run directory is gone

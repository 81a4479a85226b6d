"""``werk serve`` starting as a new user meets it (docs/operations.md, "Start-up"; docs/cli.md,
"werk serve"), each test driving a real ``werk serve`` process:

* a taken port (``--port``, ``WERK_PORT``, the default 11434) ends it with exit status 2 and one
  line on stderr naming the address and how to choose another, before any backend starts: the
  llama-server it would run is a wrapper that records being run, and never is;
* an unusable host or a bad ``WERK_PORT`` is one line too;
* once listening it prints each instance and paste-ready lines, and the pasted curl line and
  ``werk run`` line work against it (a real llama-server, marked ``llamaserver``);
* ``werk serve --help`` gives every option a text and its default, and names the environment;
* a backend nobody offers lists the installed ones and how to install another.
"""

from __future__ import annotations

import errno
import gc
import json
import os
import queue
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from werk_host.cli import start_collecting
from werk_host.testing.api import Api
from werk_host.testing.hosts import install_model

ROOT = Path(__file__).resolve().parents[1]
PYTHON = Path(sys.executable)
KEY = "sk-werk-start-print-0123456789"
#: Generous bounds on a subprocess that must end by itself (never a pass/fail threshold).
END_S = 120


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WERK_") or k == "WERK_LLAMA_SERVER"}
    env.update(extra)
    return env


def _serve(home: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(PYTHON), "-m", "werk_host", "serve", "--home", str(home), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=END_S,
        cwd=ROOT,
    )


@pytest.fixture(scope="module")
def gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    testmodel = pytest.importorskip("werk_llamacpp.testing.testmodel", reason="the llama.cpp plugin is not installed")
    path: Path = testmodel.generate_model(tmp_path_factory.mktemp("model") / "tiny.gguf")
    return path


@pytest.fixture
def recording_llama_server(tmp_path: Path) -> tuple[Path, Path]:
    """A ``WERK_LLAMA_SERVER`` that records each run in a file, then runs the real binary
    (when there is one; else it fails, as a missing binary would)."""
    record = tmp_path / "llama-server-ran"
    real = os.environ.get("WERK_LLAMA_SERVER", "")
    wrapper = tmp_path / "llama-server"
    run_real = f'exec {shlex.quote(real)} "$@"' if real and os.access(real, os.X_OK) else "exit 1"
    wrapper.write_text(f'#!/bin/sh\necho "$@" >> {shlex.quote(str(record))}\n{run_real}\n')
    wrapper.chmod(0o755)
    return wrapper, record


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port a plain socket listens on for the test."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.mark.parametrize("how", ["flag", "env"])
def test_a_taken_port_is_one_line_and_starts_no_backend(
    tmp_path: Path, gguf: Path, recording_llama_server: tuple[Path, Path], taken_port: int, how: str
) -> None:
    wrapper, record = recording_llama_server
    args = ["--model", str(gguf)] + (["--port", str(taken_port)] if how == "flag" else [])
    env = _env(WERK_LLAMA_SERVER=str(wrapper), **({"WERK_PORT": str(taken_port)} if how == "env" else {}))
    done = _serve(tmp_path / "home", *args, env=env)
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    line = lines[0]
    assert line.startswith(f"werk: 127.0.0.1:{taken_port} is already in use ("), line
    assert "--port N" in line and "WERK_PORT=N" in line and "Traceback" not in done.stderr
    assert done.stdout == ""  # never "listening"
    assert not record.exists(), f"llama-server was started: {record.read_text()}"


def test_the_default_port_taken_says_it_is_ollamas(tmp_path: Path) -> None:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", 11434))
            sock.listen()
        except OSError as err:  # someone (Ollama?) already listens there: taken all the same
            assert err.errno == errno.EADDRINUSE, err
        done = _serve(tmp_path / "home", env=_env())
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith("werk: 127.0.0.1:11434 is already in use (")
    assert "Ollama's default port" in lines[0] and "--port N or WERK_PORT=N" in lines[0]


@pytest.mark.parametrize(
    ("args", "extra", "expected"),
    [
        (["--port", "0"], {"WERK_HOST": "192.0.2.1"}, "werk: cannot listen on 192.0.2.1:0: "),
        (["--host", "192.0.2.1", "--port", "0"], {}, "werk: cannot listen on 192.0.2.1:0: "),
        ([], {"WERK_PORT": "eleven"}, "werk: WERK_PORT='eleven' is not a port number ("),
        ([], {"WERK_PORT": "70000"}, "werk: WERK_PORT='70000' is not a port number ("),
    ],
)
def test_an_unusable_address_is_one_line(tmp_path: Path, args: list[str], extra: dict[str, str], expected: str) -> None:
    done = _serve(tmp_path / "home", *args, env=_env(**extra))
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith(expected), lines[0]
    assert ("--host" in lines[0] and "WERK_HOST" in lines[0]) or "--port N" in lines[0]


def test_werk_host_and_werk_port_choose_the_address(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a free port, released for werk serve to take
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen(
        [str(PYTHON), "-m", "werk_host", "serve", "--home", str(tmp_path / "home")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(WERK_HOST="127.0.0.1", WERK_PORT=str(port)),
        cwd=ROOT,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert json.loads(line) == {"event": "listening", "host": "127.0.0.1", "port": port}
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=END_S)


def _options_help(text: str) -> dict[str, str]:
    """Each option's entry in ``--help`` output: its first flag → the entry's text."""
    entries: dict[str, str] = {}
    current: str | None = None
    section = text.split("\noptions:\n", 1)[1].split("\n\n", 1)[0]
    for line in section.splitlines():
        match = re.match(r"^  (-[-\w]+)", line)
        if match:
            current = match.group(1)
            entries[current] = line
        elif current is not None:
            entries[current] += " " + line.strip()
    return entries


def test_serve_help_gives_every_option_a_text_and_its_default() -> None:
    done = subprocess.run(
        [str(PYTHON), "-m", "werk_host", "serve", "--help"],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=END_S,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    entries = _options_help(done.stdout)
    for option in ("--host", "--port", "--persistence", "--persistence-mode", "--persistence-reuse", "--log-level"):
        assert option in entries, sorted(entries)
    for option, entry in entries.items():
        if option == "-h":
            continue
        assert re.search(r"\bdefault\b", entry), f"{option} does not show its default: {entry}"
        text = re.sub(r"^\s*-\S+( \S+)?\s*", "", entry)
        assert len(text) > len("(default: x)"), f"{option} has no help text: {entry}"
    assert "$WERK_PORT, else 11434" in entries["--port"] and "$WERK_HOST, else 127.0.0.1" in entries["--host"]
    assert "(default: info)" in entries["--log-level"]
    for variable in ("WERK_PORT", "WERK_HOST", "WERK_HOME", "WERK_API_KEYS", "WERK_OPERATOR_API_KEYS"):
        assert variable in done.stdout.split("\nenvironment:\n", 1)[1], variable


def _one_line(done: subprocess.CompletedProcess[str]) -> str:
    human = [line for line in done.stderr.splitlines() if not line.startswith("{")]  # JSON lines are logs
    assert done.returncode == 2 and len(human) == 1, done.stderr
    return human[0]


def test_a_profile_backend_nobody_offers_lists_the_installed_ones(tmp_path: Path, gguf: Path) -> None:
    profile = tmp_path / "deployments.toml"
    profile.write_text(f'[[instance]]\nid = "x"\nmodel = "{gguf}"\nbackend = "no-such-backend"\n')
    line = _one_line(_serve(tmp_path / "home", "--profile", str(profile), "--port", "0", env=_env()))
    assert line.startswith(f"werk: invalid profile: {profile}: instance x: no installed backend plugin serves"), line
    assert "(no-such-backend)" in line
    installed = line.split("installed backends: ", 1)[1]
    assert "llama.cpp (plugin llamacpp)" in installed.split(";")[0], line
    assert "pip install werk-NAME" in line and "pip install werk-llamacpp" in line


def test_a_model_whose_manifest_backend_nobody_offers_lists_the_installed_ones(tmp_path: Path, gguf: Path) -> None:
    home = tmp_path / "home"
    install_model(home, "orphan", path=gguf, backend="nobody-serves-this")
    line = _one_line(_serve(home, "--model", "orphan", "--port", "0", env=_env()))
    assert line.startswith("werk: invalid profile: --model: instance orphan: no installed backend plugin"), line
    assert "(nobody-serves-this)" in line and "installed backends: " in line and "llama.cpp" in line
    assert "pip install werk-NAME" in line


@pytest.mark.llamaserver
def test_the_start_print_names_instances_and_its_paste_lines_work(
    tmp_path: Path, gguf: Path, recording_llama_server: tuple[Path, Path]
) -> None:
    real = os.environ.get("WERK_LLAMA_SERVER", "")
    if not (real and os.access(real, os.X_OK)):
        pytest.skip("no llama-server binary: set WERK_LLAMA_SERVER")
    wrapper, _ = recording_llama_server
    profile = tmp_path / "deployments.toml"
    profile.write_text(
        f'[[instance]]\nid = "tiny"\nmodel = "{gguf}"\nbackend = "llama.cpp"\npreload = true\n'
        "options = { ctx = 2048, parallel = 1 }\n\n"
        f'[[instance]]\nid = "lazy"\nmodel = "{gguf}"\nbackend = "llama.cpp"\npreload = false\n'
    )
    env = _env(WERK_LLAMA_SERVER=str(wrapper), WERK_API_KEYS=KEY)
    proc = subprocess.Popen(
        [str(PYTHON), "-m", "werk_host", "serve", "--home", str(tmp_path / "home"), "--profile", str(profile)]
        + ["--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        listening = json.loads(proc.stdout.readline())
        port = listening["port"]
        base = f"http://127.0.0.1:{port}"
        lines: queue.Queue[str] = queue.Queue()

        def pump() -> None:  # keeps the pipe drained while the server logs on
            for line in proc.stderr or ():
                lines.put(line)

        threading.Thread(target=pump, daemon=True).start()
        printed: list[str] = []
        while not printed or not printed[-1].lstrip().startswith("werk run "):  # the summary's last line
            line = lines.get(timeout=END_S)  # a bound on a hang, not a pass/fail threshold
            if not line.startswith("{"):  # JSON lines are the log
                printed.append(line.rstrip("\n"))
        text = "\n".join(printed)
        assert KEY not in text
        api = Api(base, KEY)
        status, limits = api.get("/werk/v1/chat/limits", model="tiny")
        assert status == 200, limits
        context = limits["data"]["context_tokens"]
        assert isinstance(context, int) and context > 0
        assert re.search(
            rf"^  tiny +model tiny +backend llama\.cpp +context: {context} tokens per request$", text, re.M
        )
        assert re.search(r"^  lazy +model tiny +backend llama\.cpp +context: starts on first use$", text, re.M), text
        status, inventory = api.get("/werk/v1/deployments")
        states = {i["id"]: i["state"] for i in inventory["data"]["inventory"]}
        assert states == {"tiny": "ready", "lazy": "cold"}  # printing never started the lazy one
        assert f"  OpenAI base URL:    {base}/v1" in printed
        assert f"  Anthropic base URL: {base}" in printed and f"  Ollama host:        {base}" in printed

        curl = next(line for line in printed if line.lstrip().startswith("curl "))
        assert '-H "Authorization: Bearer $WERK_API_KEY"' in curl
        pasted = subprocess.run(
            ["bash", "-c", curl], capture_output=True, text=True, env={**env, "WERK_API_KEY": KEY}, timeout=END_S
        )
        assert pasted.returncode == 0, pasted.stderr
        answer = json.loads(pasted.stdout)
        assert answer["object"] == "chat.completion" and answer["model"] == "tiny", answer
        assert isinstance(answer["choices"][0]["message"]["content"], str)

        run_line = printed[-1].strip()
        assert run_line == f'werk run --server {base} tiny "hello"'
        werk_bin = PYTHON.parent
        ran = subprocess.run(
            ["bash", "-c", run_line],
            capture_output=True,
            text=True,
            env={**env, "WERK_API_KEY": KEY, "PATH": f"{werk_bin}:{env.get('PATH', '')}"},
            timeout=END_S,
            stdin=subprocess.DEVNULL,
        )
        assert ran.returncode == 0, ran.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=END_S)


def test_the_collector_paused_for_the_start_runs_again_with_the_start_frozen() -> None:
    """``werk serve`` pauses the cyclic collector for its start (werk_host.cli); once it listens
    the collector runs again, the objects of the start frozen out of its passes."""
    gc.disable()
    try:
        start_collecting()
        assert gc.isenabled() and gc.get_freeze_count() > 0
        frozen = gc.get_freeze_count()
        start_collecting()  # a collector that runs is left as it is
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()
        gc.enable()

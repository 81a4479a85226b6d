"""The real command line: ``werk serve`` answers ``/v1/chat/completions`` through the ONNX GenAI
worker for an unpinned GenAI model directory, and the worker dies with ``werk serve`` even when
it is SIGKILLed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from werk_onnx_genai.adapter import WORKER

KEY = "sk-onnx-genai--" + "t" * 24


def _werk(home: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "WERK_HOME": str(home), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "werk_host", *args], capture_output=True, text=True, env=environ, timeout=120
    )


def _post(url: str, body: object) -> bytes:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as answer:
        data: bytes = answer.read()
        return data


def _workers_of(model: Path) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(WORKER).encode() in argv and str(model).encode() in argv:
            found.append(int(proc.name))
    return found


@pytest.mark.engine
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the worker through /proc")
def test_werk_serve_answers_v1_chat_and_its_worker_dies_with_it(tmp_path: Path, engine: str, genai_model: Path) -> None:
    home = tmp_path / "home"
    # Unpinned: a GenAI model directory is this backend's alone, whatever else is installed.
    assert _werk(home, "models", "add", "tiny", str(genai_model)).returncode == 0
    env = {**os.environ, "WERK_HOME": str(home), "WERK_API_KEYS": KEY, "WERK_ONNX_GENAI_PYTHON": engine}
    serve = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "werk_host",
            "serve",
            "--port",
            "0",
            "--model",
            "tiny",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        text=True,
    )
    try:
        assert serve.stdout is not None
        base = f"http://127.0.0.1:{json.loads(serve.stdout.readline())['port']}"
        messages = [{"role": "user", "content": "Hello there"}]
        body = {"model": "tiny", "messages": messages, "max_tokens": 4, "temperature": 0, "stream": True}
        raw = _post(f"{base}/v1/chat/completions", {**body, "stream_options": {"include_usage": True}}).decode()
        events = [line[6:] for line in raw.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        usage = json.loads(events[-2])["usage"]
        counted = json.loads(_post(f"{base}/werk/v1/chat/count_tokens", {"model": "tiny", "messages": messages}))
        assert counted["data"]["input_tokens"] == usage["prompt_tokens"] > 0
        workers = _workers_of(genai_model)
        assert workers  # the worker (and, under the group guard, its guard process)
    finally:
        serve.send_signal(signal.SIGKILL)
        serve.wait()
    deadline = time.monotonic() + 30
    while _workers_of(genai_model) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _workers_of(genai_model) == []

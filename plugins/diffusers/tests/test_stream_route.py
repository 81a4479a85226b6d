"""The kit's streamed worker route (werk_host/plugin/engine_worker.py, docs/plugin-kit.md "Engine
workers"), with a fake engine that only streams: NDJSON lines, 404 for ``None``, 400 for a
ValueError before the first line, an exception after it as the last line, ``answer`` outside
the lock, the chat routes refused, and a client that leaves setting ``cancelled``."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from werk_host.plugin.engines import WORKER_KIT
from werk_host.plugin.workers import free_port

FAKE = """
import importlib.util, sys, threading, time
spec = importlib.util.spec_from_file_location("werk_engine_worker", sys.argv[1])
kit = importlib.util.module_from_spec(spec)
spec.loader.exec_module(kit)
MARK = sys.argv[3]

class Engine:
    def answer(self, path, body):
        return {"pong": body.get("x")} if path == "/ping" else None

    def stream(self, path, body, cancelled):
        if path == "/bad":
            raise ValueError("bad body")
        if path == "/lines":
            return iter([{"event": "progress", "step": 1}, {"event": "result", "n": 2}])
        if path == "/boom":
            def boom():
                yield {"event": "progress", "step": 1}
                raise RuntimeError("engine failed")
            return boom()
        if path == "/slow":
            def slow():
                try:
                    for i in range(10000):
                        time.sleep(0.01)
                        yield {"event": "progress", "step": i, "pad": "x" * 4096}
                finally:
                    if cancelled.is_set():  # set by the failed write before the stream is closed
                        open(MARK, "w").write("cancelled")
            return slow()
        return None

sys.exit(kit.run("FAKE_KEY", int(sys.argv[2]), Engine))
"""


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path]]:
    port = free_port("127.0.0.1")
    mark = tmp_path_factory.mktemp("fake") / "cancelled"
    proc = subprocess.Popen(
        [sys.executable, "-c", FAKE, str(WORKER_KIT), str(port), str(mark)],
        env={**os.environ, "FAKE_KEY": "k"},
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                http.client.HTTPConnection("127.0.0.1", port, timeout=1).request("GET", "/health")
                break
            except OSError:
                time.sleep(0.05)
        yield port, mark
    finally:
        proc.kill()
        proc.wait()


def post(port: int, path: str, body: object) -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    data = json.dumps(body).encode()
    conn.request("POST", path, data, {"Authorization": "Bearer k", "Content-Type": "application/json"})
    return conn.getresponse()


def test_lines_are_ndjson_and_errors_are_statuses_or_a_last_line(worker: tuple[int, Path]) -> None:
    port, _ = worker
    answer = post(port, "/lines", {"a": 1})
    assert answer.status == 200 and answer.getheader("Content-Type") == "application/x-ndjson"
    assert [json.loads(line) for line in answer.read().splitlines()] == [
        {"event": "progress", "step": 1},
        {"event": "result", "n": 2},
    ]
    assert post(port, "/nothing", {"a": 1}).status == 404
    bad = post(port, "/bad", {"a": 1})
    assert bad.status == 400 and b"bad body" in bad.read()
    lines = [json.loads(line) for line in post(port, "/boom", {"a": 1}).read().splitlines()]
    assert lines[-1] == {"event": "error", "type": "RuntimeError", "message": "engine failed"}
    assert json.loads(post(port, "/ping", {"x": 3}).read()) == {"pong": 3}
    assert post(port, "/count", {"messages": []}).status == 400  # no chat in this engine


def test_a_client_that_leaves_sets_cancelled(worker: tuple[int, Path]) -> None:
    port, mark = worker
    answer = post(port, "/slow", {"a": 1})
    assert answer.status == 200
    answer.readline()
    answer.close()  # the client goes away
    deadline = time.monotonic() + 20
    while not mark.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert mark.exists()
    assert post(port, "/lines", {"a": 1}).status == 200  # the lock was released

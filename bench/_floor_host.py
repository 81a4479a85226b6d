"""The start-up floor of a Python host in front of ``llama-server`` (``bench/cold_start.py --floor``).

    python bench/_floor_host.py PORT CHILD_PORT LLAMA_SERVER GGUF [CHILD_ARGS...]

What any host built from this stack pays at least before its first answer, and nothing more:
the child is spawned first thing (with the arguments ``werk serve`` gives it: the same load),
then, while it loads, the stack Werk is built from is imported (pluggy, psutil, filelock,
pydantic, falcon, waitress), the ``werk`` entry points are scanned and a falcon app with one
pydantic-validated route is built and its address bound (a request waits in the backlog, as
with ``werk serve``); ``/health`` is polled every 2 ms; then ``POST /v1/chat/completions`` is
relayed to the child as it came. No keys, no states, no prompt
caches, no admission, no plugins: not a host, the floor under one (docs/operations.md,
"Start-up").
"""

from __future__ import annotations

import os
import subprocess
import sys

PORT, CHILD_PORT, SERVER, GGUF = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
CHILD = [SERVER, "-m", GGUF, "--host", "127.0.0.1", "--port", str(CHILD_PORT), *sys.argv[5:]]
child = subprocess.Popen(CHILD, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

import http.client  # noqa: E402
import importlib.metadata  # noqa: E402
import signal  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import falcon  # noqa: E402
import filelock  # noqa: E402, F401
import pluggy  # noqa: E402, F401
import psutil  # type: ignore[import-untyped]  # noqa: E402, F401
import pydantic  # noqa: E402
from waitress.server import create_server  # type: ignore[import-untyped]  # noqa: E402

list(importlib.metadata.entry_points(group="werk"))


class Message(pydantic.BaseModel):
    role: str
    content: str


class ChatRequest(pydantic.BaseModel):
    model: str
    messages: list[Message]
    max_tokens: int | None = None
    temperature: float | None = None
    seed: int | None = None


class Chat:
    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        body = req.bounded_stream.read()
        ChatRequest.model_validate_json(body)
        conn = http.client.HTTPConnection("127.0.0.1", CHILD_PORT, timeout=60)
        conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        answer = conn.getresponse()
        resp.status = answer.status
        resp.data = answer.read()
        resp.content_type = "application/json"


app: Any = falcon.App()
app.add_route("/v1/chat/completions", Chat())


def healthy() -> bool:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", CHILD_PORT, timeout=5)
        conn.request("GET", "/health")
        answer = conn.getresponse()
        answer.read()
        return answer.status == 200
    except OSError:
        return False


server = create_server(app, host="127.0.0.1", port=PORT, threads=8)
while not healthy():
    if child.poll() is not None:
        sys.exit(f"llama-server exited with {child.returncode}")
    time.sleep(0.002)


def stop(signum: int, frame: object) -> None:
    raise SystemExit(0)


signal.signal(signal.SIGTERM, stop)
try:
    server.run()
finally:
    os.killpg(child.pid, signal.SIGKILL)
    child.wait()

"""The worker side of an engine worker (docs/plugin-kit.md, "Engine workers"): the small HTTP
server on 127.0.0.1 that a plugin's ``worker.py`` runs in the engine's own virtualenv, around
an engine object of its own.

**Standard library only, nothing of Werk.** The engine virtualenv has no ``werk_host``; the
plugin's worker loads this file by path (the adapter, :class:`werk_host.plugin.engines.EngineAdapter`,
passes :data:`werk_host.plugin.engines.WORKER_KIT` as ``--kit PATH``)::

    spec = importlib.util.spec_from_file_location("werk_engine_worker", args.kit)
    ...
    return kit.run(KEY_ENV, args.port, lambda: Engine(args.model))

The contract, for the engine (:class:`Engine`) and the adapter:

* **Key.** :func:`run` takes the key out of the environment variable ``key_env`` (never argv;
  it is removed from ``os.environ`` before the engine loads) and exits 2 when it is unset. Every
  ``POST`` must carry ``Authorization: Bearer <key>`` (compared in constant time) or is
  answered 401. ``GET /health`` needs no key: it says only that the worker is up.
* **Loopback only.** The server binds 127.0.0.1, nothing else.
* **Bounded reads.** A ``POST`` body is read only when its ``Content-Length`` is from 1 to
  :data:`MAX_BODY` bytes and is a JSON object, else 400 and nothing more is read.
* **Ready means loaded.** The engine loads before the port listens, so ``GET /health``
  answering 200 means "loaded and ready" (the adapter's residency evidence).
* ``POST /count`` ``{"messages": [...], "tools": [...]?}`` answers ``{"prompt_tokens": N}``:
  ``len(engine.prompt_ids(messages, tools, counting=True))``, outside the generation lock (the
  engine counts with a tokenizer of its own, so a count never waits for a generation).
* ``POST /v1/chat/completions``: an OpenAI chat answer, JSON or server-sent events (chunked),
  with ``usage`` (in the final chunk; also a ``choices: []`` chunk when
  ``stream_options.include_usage``). Generations are serialized by one lock; a client that goes
  away (a failed write) sets the generation's ``cancelled`` event, and the engine stops at its
  next token.
* Messages reach the engine as :func:`plain` messages (content parts joined into one string);
  ``tools`` is the request's list or ``None``. A ``ValueError``, ``TypeError`` or ``KeyError``
  from the engine is a 400.
* **Other routes, optional** (an engine that only streams, like the diffusers worker, need not
  have ``prompt_ids`` or ``generate``; ``/count`` and the chat route then answer 400).
  ``engine.answer(path, body) -> dict | None``, when the engine has it, is offered every other
  ``POST`` first, outside the generation lock (a status read that must not wait for a
  generation): a dict is answered 200 JSON, ``None`` passes the path on.
  ``engine.stream(path, body, cancelled) -> Iterator[dict] | None`` is offered it next, under
  the generation lock: ``None`` is a 404; an iterator is answered 200
  ``application/x-ndjson``, chunked, one JSON object per line, flushed per line. A
  ``ValueError``, ``TypeError`` or ``KeyError`` raised before the first item is a 400 as above,
  any other exception there a 500 ``{"error": {"message", "type"}}``; an exception after it
  becomes the last line, ``{"event": "error", "type": "<ValueError|...>", "message": "..."}``.
  A failed write (the client went away) sets ``cancelled`` and closes the connection; the
  engine stops at its next step.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

__all__ = ["LOOPBACK", "MAX_BODY", "Engine", "Handler", "chunk", "plain", "run"]

LOOPBACK = "127.0.0.1"
#: The largest request body a worker reads.
MAX_BODY = 64 << 20

Piece = tuple[str, str | None, int]


class Engine(Protocol):
    """What a plugin's worker provides: one loaded model. ``prompt_ids`` and ``generate`` serve
    the chat routes; an engine without them (one that only streams: ``stream`` and ``answer``,
    module docstring) answers those routes 400."""

    def prompt_ids(self, messages: list[dict[str, Any]], tools: Any, *, counting: bool = False) -> list[int]:
        """The token ids of the prompt the chat route feeds the model (its chat template with the
        generation prompt); ``counting``: from the count tokenizer, not the generation's."""
        ...

    def generate(self, body: dict[str, Any], ids: list[int], cancelled: threading.Event) -> Iterator[Piece]:
        """Yield ``(text piece, finish_reason or None, completion tokens so far)``; the last item
        carries the finish reason. Runs under the generation lock (the caller holds it); returns
        early once ``cancelled`` is set."""
        ...


def plain(message: Any) -> dict[str, Any]:
    """A message whose content parts (OpenAI's ``[{"type": "text", "text": ...}]``) are joined
    into one string, as chat templates expect."""
    if not isinstance(message, dict):
        return {"role": "user", "content": ""}
    content = message.get("content")
    if isinstance(content, list):
        text = "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
        message = {**message, "content": text}
    elif content is None:
        message = {**message, "content": ""}
    return dict(message)


def _prompt(engine: Engine, body: dict[str, Any], *, counting: bool = False) -> list[int]:
    messages = [plain(m) for m in body.get("messages") or []]
    return engine.prompt_ids(messages, body.get("tools") or None, counting=counting)


def chunk(rid: str, model: str, delta: dict[str, Any], finish: str | None, usage: Any = None) -> bytes:
    """One ``chat.completion.chunk`` server-sent event."""
    doc: dict[str, Any] = {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    if usage is not None:
        doc["usage"] = usage
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    engine: Engine
    key: str
    lock: threading.Lock
    model_name = "model"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass

    def _authorized(self) -> bool:
        if secrets.compare_digest(self.headers.get("Authorization", ""), f"Bearer {self.key}"):
            return True
        self._json(401, {"error": {"message": "unauthorized"}})
        return False

    def _json(self, status: int, doc: dict[str, Any]) -> None:
        data = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> dict[str, Any] | None:
        length = int(self.headers.get("Content-Length") or 0)
        if not 0 < length <= MAX_BODY:
            self._json(400, {"error": {"message": "a JSON body is required"}})
            return None
        try:
            doc = json.loads(self.rfile.read(length))
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            self._json(400, {"error": {"message": "the body is not a JSON object"}})
            return None
        return doc

    def do_GET(self) -> None:
        if self.path == "/health":
            self._json(200, {"status": "ok"})
        else:
            self._json(404, {"error": {"message": "not found"}})

    def do_POST(self) -> None:
        if not self._authorized():
            return
        body = self._body()
        if body is None:
            return
        try:
            if self.path in ("/count", "/v1/chat/completions") and not hasattr(self.engine, "generate"):
                self._json(400, {"error": {"message": "this worker serves no chat"}})
            elif self.path == "/count":
                self._json(200, {"prompt_tokens": len(_prompt(self.engine, body, counting=True))})
            elif self.path == "/v1/chat/completions":
                self._chat(body)
            else:
                self._other(body)
        except (ValueError, TypeError, KeyError) as err:
            self._json(400, {"error": {"message": f"{type(err).__name__}: {err}"}})

    def _other(self, body: dict[str, Any]) -> None:
        """A path other than the chat routes: ``engine.answer``, then ``engine.stream``."""
        answer = getattr(self.engine, "answer", None)
        if answer is not None:
            doc = answer(self.path, body)
            if doc is not None:
                self._json(200, doc)
                return
        stream = getattr(self.engine, "stream", None)
        if stream is None:
            self._json(404, {"error": {"message": "not found"}})
            return
        cancelled = threading.Event()
        with self.lock:
            lines: Iterator[dict[str, Any]] | None = stream(self.path, body, cancelled)
            if lines is None:
                self._json(404, {"error": {"message": "not found"}})
                return
            try:
                try:
                    first = next(lines, None)
                except (ValueError, TypeError, KeyError):
                    raise
                except Exception as err:  # noqa: BLE001 - any engine failure is answered
                    self._json(500, {"error": {"message": str(err), "type": type(err).__name__}})
                    return
                self._stream_lines(first, lines, cancelled)
            finally:
                close = getattr(lines, "close", None)
                if close is not None:
                    close()

    def _stream_lines(
        self, first: dict[str, Any] | None, lines: Iterator[dict[str, Any]], cancelled: threading.Event
    ) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            if first is not None:
                self._send(json.dumps(first).encode() + b"\n")
                while True:
                    try:
                        item = next(lines, None)
                    except Exception as err:  # noqa: BLE001 - the stream's last line says it
                        doc = {"event": "error", "type": type(err).__name__, "message": str(err)}
                        self._send(json.dumps(doc).encode() + b"\n")
                        break
                    if item is None:
                        break
                    self._send(json.dumps(item).encode() + b"\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            cancelled.set()  # the client went away: the engine stops at its next step
            self.close_connection = True

    def _chat(self, body: dict[str, Any]) -> None:
        engine = self.engine
        rid = "chatcmpl-" + secrets.token_hex(12)
        model = str(body.get("model") or self.model_name)
        cancelled = threading.Event()
        with self.lock:
            ids = _prompt(engine, body)
            prompt = len(ids)
            pieces = engine.generate(body, ids, cancelled)
            if body.get("stream") is not True:
                text, finish, completion = "", "stop", 0
                for piece, end, produced in pieces:
                    text += piece
                    finish, completion = end or finish, produced
                usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
                self._json(
                    200,
                    {
                        "id": rid,
                        "object": "chat.completion",
                        "created": int(time.time()),
                        "model": model,
                        "choices": [
                            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
                        ],
                        "usage": usage,
                    },
                )
                return
            options = body.get("stream_options")
            include_usage = isinstance(options, dict) and options.get("include_usage") is True
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                self._send(chunk(rid, model, {"role": "assistant", "content": ""}, None))
                for piece, end, completion in pieces:
                    if piece:
                        self._send(chunk(rid, model, {"content": piece}, None))
                    if end is not None:
                        usage = {
                            "prompt_tokens": prompt,
                            "completion_tokens": completion,
                            "total_tokens": prompt + completion,
                        }
                        self._send(chunk(rid, model, {}, end, usage))
                        if include_usage:
                            tail = json.loads(chunk(rid, model, {}, None, usage)[6:])
                            tail["choices"] = []
                            self._send(b"data: " + json.dumps(tail).encode() + b"\n\n")
                self._send(b"data: [DONE]\n\n")
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except OSError:
                cancelled.set()  # the client went away: stop at the next token
                self.close_connection = True

    def _send(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()


def run(key_env: str, port: int, load: Callable[[], Engine]) -> int:
    """The worker's life: take the key from ``key_env`` (exit status 2 when unset), ``load`` the
    engine, then serve it on 127.0.0.1:``port`` until the process is stopped."""
    key = os.environ.pop(key_env, "")
    if not key:
        print(f"worker: {key_env} is not set", file=sys.stderr)
        return 2
    handler = type("EngineHandler", (Handler,), {"engine": load(), "key": key, "lock": threading.Lock()})
    server = ThreadingHTTPServer((LOOPBACK, port), handler)
    server.daemon_threads = True
    print(f"worker: serving on {LOOPBACK}:{port}", file=sys.stderr, flush=True)
    server.serve_forever()
    return 0

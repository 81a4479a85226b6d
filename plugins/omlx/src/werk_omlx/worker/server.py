"""The worker's HTTP API: OpenAI-compatible inference plus the expert and status routes Werk uses.

``python -m werk_omlx.worker --model-dir DIR --port N [--expert-cache-bytes B] [--prefix-cache-dir D]``
loads the model (docs/omlx.md, "The worker") and serves on 127.0.0.1. Every request must carry
``Authorization: Bearer $WERK_OMLX_WORKER_KEY`` (the key travels in the environment, never on
the argv). Routes:

* ``GET /health``: 200 once the model is loaded.
* ``GET /werk/status``: model type, offload (active, reason, counters), prefix cache.
* ``GET /werk/experts``: every expert (layer, expert, bytes, resident, pinned, accesses, last use).
* ``POST /werk/experts/actions``: ``{"action", "experts": [[layer, expert], …], "dry_run"}``;
  answers the plan and the touched experts; 404 unknown expert, 409 a pinned eviction,
  429 capacity; 501 when offload is not active.
* ``POST /werk/count_tokens``: the exact prompt tokens of a chat body.
* ``POST /v1/chat/completions``, ``POST /v1/completions``: OpenAI bodies, ``stream`` included.

One generation runs at a time; a client that goes away cancels its generation at the next token.
"""

from __future__ import annotations

import argparse
import hmac
import json
import logging
import os
import secrets
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from .engine import Engine, Piece, Sampling, Usage, load
from .offload import CapacityError, Key, PinnedError, Plan
from .prefix import DEFAULT_MAX_BYTES, PrefixCache

log = logging.getLogger("werk_omlx.worker")

ENV_KEY = "WERK_OMLX_WORKER_KEY"
MAX_BODY = 8 * 1024 * 1024
DEFAULT_MAX_TOKENS = 256
ACTIONS = ("prefetch", "pin", "unpin", "evict")


class RequestError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def _int(body: dict[str, Any], name: str, default: int | None) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise RequestError(400, "invalid_request", f"{name} must be a positive integer")
    return value


def _float(body: dict[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, int | float) or isinstance(value, bool) or not low <= value <= high:
        raise RequestError(400, "invalid_request", f"{name} must be a number in [{low}, {high}]")
    return float(value)


def sampling_of(body: dict[str, Any]) -> Sampling:
    max_tokens = _int(body, "max_completion_tokens", None) or _int(body, "max_tokens", DEFAULT_MAX_TOKENS)
    stop = body.get("stop")
    stops = (stop,) if isinstance(stop, str) else tuple(stop) if isinstance(stop, list) else ()
    if not all(isinstance(s, str) and s for s in stops) or len(stops) > 4:
        raise RequestError(400, "invalid_request", "stop must be a string or up to 4 non-empty strings")
    seed = body.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise RequestError(400, "invalid_request", "seed must be an integer")
    return Sampling(
        max_tokens=max_tokens or DEFAULT_MAX_TOKENS,
        temperature=_float(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_float(body, "top_p", 1.0, 0.0, 1.0),
        seed=seed,
        stop=stops,
    )


def template_kwargs(body: dict[str, Any]) -> dict[str, Any]:
    kwargs = body.get("chat_template_kwargs")
    out: dict[str, Any] = dict(kwargs) if isinstance(kwargs, dict) else {}
    thinking = body.get("enable_thinking")
    if isinstance(thinking, bool):
        out["enable_thinking"] = thinking
    return out


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise RequestError(400, "invalid_request", "messages must be a non-empty list of message objects")
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):  # text parts only: this worker serves text models
            texts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
            if len(texts) != len(content):
                raise RequestError(400, "invalid_request", "this model takes text content only")
            content = "".join(str(t) for t in texts)
        out.append({**m, "content": content if content is not None else ""})
    return out


class Worker:
    """The loaded engine and the worker's identity (module docstring)."""

    def __init__(self, engine: Engine, model_name: str) -> None:
        self.engine = engine
        self.model_name = model_name
        self.created = int(time.time())

    # -- experts ------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        loaded = self.engine.loaded
        store = loaded.store
        offload: dict[str, Any] = {"active": store is not None, "reason": loaded.offload_reason}
        if store is not None:
            offload.update(store.snapshot())
            offload["layers"] = len(store.slices)
            offload["experts"] = len(store.keys())
        prefix = self.engine.prefix
        return {
            "model_type": loaded.model_type,
            "offload": offload,
            "prefix_cache": prefix.snapshot() if prefix is not None else None,
            "pid": os.getpid(),
        }

    def experts(self) -> dict[str, Any]:
        store = self.engine.loaded.store
        if store is None:
            raise RequestError(501, "unsupported", "expert offload is not active in this worker")
        return {"experts": [view.__dict__ for view in store.view()], "offload": store.snapshot()}

    def expert_action(self, body: dict[str, Any]) -> dict[str, Any]:
        store = self.engine.loaded.store
        if store is None:
            raise RequestError(501, "unsupported", "expert offload is not active in this worker")
        action, raw, dry_run = body.get("action"), body.get("experts"), body.get("dry_run")
        if action not in ACTIONS or not isinstance(raw, list) or not raw or not isinstance(dry_run, bool):
            raise RequestError(400, "invalid_request", "an action, a non-empty expert list and dry_run are required")
        keys: list[Key] = []
        for item in raw:
            if not (isinstance(item, list) and len(item) == 2 and all(type(v) is int for v in item)):
                raise RequestError(400, "invalid_request", "an expert is [layer, expert]")
            key = (item[0], item[1])
            if not store.known(key):
                raise RequestError(404, "not_found", "no such expert")
            keys.append(key)
        if len(set(keys)) != len(keys):
            raise RequestError(400, "invalid_request", "experts must be unique")
        try:
            plan: Plan = getattr(store, str(action))(keys, dry_run)
        except CapacityError as err:
            raise RequestError(429, "resource_exhausted", str(err)) from err
        except PinnedError as err:
            raise RequestError(409, "conflict", str(err)) from err
        touched = list(dict.fromkeys([*keys, *plan.evict]))
        return {
            "changed": plan.changed,
            "dry_run": dry_run,
            "plan": {name: [list(k) for k in getattr(plan, name)] for name in ("load", "evict", "pin", "unpin")},
            "experts": [view.__dict__ for view in store.view(touched)],
        }

    # -- inference ----------------------------------------------------------------------------
    def count_tokens(self, body: dict[str, Any]) -> dict[str, Any]:
        tools = body.get("tools") if isinstance(body.get("tools"), list) else None
        tokens = self.engine.chat_tokens(_messages(body), tools, template_kwargs(body))
        return {"count": len(tokens)}

    def prompt(self, body: dict[str, Any], chat: bool) -> list[int]:
        if chat:
            tools = body.get("tools") if isinstance(body.get("tools"), list) else None
            return self.engine.chat_tokens(_messages(body), tools, template_kwargs(body))
        prompt = body.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            raise RequestError(400, "invalid_request", "prompt must be a non-empty string")
        return self.engine.text_tokens(prompt)


def _chunk(chat: bool, ident: str, created: int, model: str, text: str, finish: str | None) -> dict[str, Any]:
    if chat:
        delta: dict[str, Any] = {"content": text} if text else {}
        choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
        kind = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text, "finish_reason": finish}
        kind = "text_completion"
    return {"id": ident, "object": kind, "created": created, "model": model, "choices": [choice]}


def _usage(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: WorkerServer

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    # -- plumbing -------------------------------------------------------------------------------
    def _authorized(self) -> bool:
        given = self.headers.get("Authorization", "")
        return hmac.compare_digest(given.encode(), f"Bearer {self.server.key}".encode())

    def _send_json(self, status: int, doc: Any) -> None:
        raw = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def _error(self, err: RequestError) -> None:
        self._send_json(
            err.status, {"error": {"message": err.message, "type": "invalid_request_error", "code": err.code}}
        )

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            raise RequestError(413, "request_too_large", "the request body is too large")
        raw = self.rfile.read(length) if length else b"{}"
        try:
            body = json.loads(raw)
        except ValueError as err:
            raise RequestError(400, "invalid_request", "the body is not JSON") from err
        if not isinstance(body, dict):
            raise RequestError(400, "invalid_request", "the body must be a JSON object")
        return body

    def _dispatch(self, method: str) -> None:
        if self.path == "/health" and method == "GET":
            self._send_json(200, {"status": "ok"})
            return
        if not self._authorized():
            self._send_json(401, {"error": {"message": "unauthorized", "type": "auth_error", "code": "unauthorized"}})
            return
        worker = self.server.worker
        try:
            route = (method, self.path)
            if route == ("GET", "/werk/status"):
                self._send_json(200, worker.status())
            elif route == ("GET", "/werk/experts"):
                self._send_json(200, worker.experts())
            elif route == ("POST", "/werk/experts/actions"):
                self._send_json(200, worker.expert_action(self._body()))
            elif route == ("POST", "/werk/count_tokens"):
                self._send_json(200, worker.count_tokens(self._body()))
            elif route == ("GET", "/v1/models"):
                entry = {"id": worker.model_name, "object": "model", "created": worker.created, "owned_by": "werk"}
                self._send_json(200, {"object": "list", "data": [entry]})
            elif route in (("POST", "/v1/chat/completions"), ("POST", "/v1/completions")):
                self._complete(self._body(), chat=self.path.endswith("chat/completions"))
            else:
                raise RequestError(404, "not_found", "no such route")
        except RequestError as err:
            self._error(err)

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._dispatch("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch("POST")

    # -- completions ------------------------------------------------------------------------------
    def _complete(self, body: dict[str, Any], chat: bool) -> None:
        worker = self.server.worker
        sampling = sampling_of(body)
        prompt = worker.prompt(body, chat)
        usage = Usage()
        cancelled = threading.Event()
        ident = ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12)
        created = int(time.time())
        model = worker.model_name
        pieces = worker.engine.generate(prompt, sampling, usage, cancelled)
        if body.get("stream") is True:
            self._stream(pieces, chat, ident, created, model, usage, cancelled)
            return
        text, finish = "", None
        for piece in pieces:
            text += piece.text
            finish = piece.finish_reason or finish
        if chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": finish,
            }
        else:
            choice = {"index": 0, "text": text, "finish_reason": finish}
        self._send_json(
            200,
            {
                "id": ident,
                "object": "chat.completion" if chat else "text_completion",
                "created": created,
                "model": model,
                "choices": [choice],
                "usage": _usage(usage),
            },
        )

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _stream(
        self,
        pieces: Iterator[Piece],
        chat: bool,
        ident: str,
        created: int,
        model: str,
        usage: Usage,
        cancelled: threading.Event,
    ) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            if chat:
                first = _chunk(chat, ident, created, model, "", None)
                first["choices"][0]["delta"] = {"role": "assistant", "content": ""}
                self._write_chunk(b"data: " + json.dumps(first).encode() + b"\n\n")
            for piece in pieces:
                event = _chunk(chat, ident, created, model, piece.text, piece.finish_reason)
                if piece.finish_reason is not None:
                    event["usage"] = _usage(usage)
                self._write_chunk(b"data: " + json.dumps(event).encode() + b"\n\n")
            self._write_chunk(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            cancelled.set()
            close = getattr(pieces, "close", None)
            if close is not None:
                close()
            self.close_connection = True


class WorkerServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int, worker: Worker, key: str) -> None:
        super().__init__(("127.0.0.1", port), Handler)
        self.worker = worker
        self.key = key


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m werk_omlx.worker")
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--model-name", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--expert-cache-bytes", type=int, default=None)
    parser.add_argument("--prefix-cache-dir", type=Path, default=None)
    parser.add_argument("--prefix-cache-bytes", type=int, default=DEFAULT_MAX_BYTES)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    key = os.environ.pop(ENV_KEY, "")
    if not key:
        parser.error(f"{ENV_KEY} must be set")
    loaded = load(args.model_dir, args.expert_cache_bytes)
    if args.expert_cache_bytes is not None and loaded.store is None:
        log.warning("expert offload is not active: %s", loaded.offload_reason)
    prefix = PrefixCache(args.prefix_cache_dir, args.prefix_cache_bytes) if args.prefix_cache_dir else None
    server = WorkerServer(args.port, Worker(Engine(loaded, prefix), args.model_name), key)
    log.info("worker ready on port %d (offload %s)", args.port, "active" if loaded.store else "off")
    server.serve_forever()

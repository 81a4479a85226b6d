"""The ONNX Runtime GenAI worker: one GenAI model directory behind a small HTTP server on
127.0.0.1, CPU execution.

Run by path with the engine virtualenv's interpreter (``scripts/setup-engine-venv.sh
onnx-genai`` makes one), never imported by the plugin: the standard library and
``onnxruntime_genai`` only, nothing of Werk::

    <venv>/bin/python worker.py --model DIR --port P

Contract (docs/onnx-genai.md, "The worker"):

* The key comes from ``WERK_ONNX_GENAI_WORKER_KEY`` (never argv); every POST must carry
  ``Authorization: Bearer <key>`` or is answered 401.
* The model and tokenizer load before the port listens: ``GET /health`` answering 200 means
  "loaded" (the adapter's residency evidence).
* ``POST /count`` ``{"messages": [...], "tools": [...]?}``: ``{"prompt_tokens": N}``, the tokens
  of the prompt the chat route feeds the model (the model's chat template, applied by GenAI's
  tokenizer, with the generation prompt).
* ``POST /v1/chat/completions``: an OpenAI chat answer, JSON or server-sent events (chunked),
  with ``usage``. Each request gets a **new generator** and prompt state (the seed's ONNX
  Runtime Python GenAI row: no prefix reuse); generations are serialized by one lock. A client
  that goes away (a failed write) ends the generation at the next token.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import secrets
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

KEY_ENV = "WERK_ONNX_GENAI_WORKER_KEY"
MAX_BODY = 64 << 20


class Engine:
    def __init__(self, model_dir: str) -> None:
        og: Any = importlib.import_module("onnxruntime_genai")
        self.og = og
        self.model = og.Model(model_dir)
        self.tokenizer = og.Tokenizer(self.model)
        self.count_tokenizer = og.Tokenizer(self.model)  # counts never share the generation's
        with open(os.path.join(model_dir, "genai_config.json"), encoding="utf-8") as handle:
            model = json.load(handle)["model"]
        self.context = int(model.get("context_length") or 0)
        eos = model.get("eos_token_id")
        self.eos = {int(i) for i in (eos if isinstance(eos, list) else [eos]) if isinstance(i, int)}
        self.lock = threading.Lock()

    def prompt_ids(self, body: dict[str, Any], tokenizer: Any = None) -> list[int]:
        tokenizer = self.tokenizer if tokenizer is None else tokenizer
        messages = [_plain(m) for m in body.get("messages") or []]
        tools = body.get("tools")
        text = tokenizer.apply_chat_template(
            json.dumps(messages), tools=json.dumps(tools) if tools else None, add_generation_prompt=True
        )
        return [int(i) for i in tokenizer.encode(text)]

    def generate(
        self, body: dict[str, Any], ids: list[int], cancelled: threading.Event
    ) -> Iterator[tuple[str, str | None, int]]:
        """Yield ``(text piece, finish_reason or None, completion tokens so far)``; the last item
        carries the finish reason. The caller holds the lock."""
        og = self.og
        limit = body.get("max_tokens") or body.get("max_completion_tokens")
        room = self.context - len(ids) if self.context else 1 << 20
        max_new = max(0, min(int(limit), room) if isinstance(limit, int) else room)
        if max_new == 0:
            yield "", "length", 0
            return
        temperature = body.get("temperature")
        temperature = 1.0 if temperature is None else float(temperature)
        params = og.GeneratorParams(self.model)
        search: dict[str, Any] = {"max_length": len(ids) + max_new}
        if temperature <= 0:
            search.update(do_sample=False)
        else:
            search.update(do_sample=True, temperature=temperature, top_p=float(body.get("top_p") or 1.0), top_k=0)
        params.set_search_options(**search)
        seed = body.get("seed")
        if isinstance(seed, int):
            params.set_search_options(random_seed=seed)
        stops = body.get("stop") or []
        stops = [stops] if isinstance(stops, str) else [s for s in stops if isinstance(s, str) and s]
        generator = og.Generator(self.model, params)  # a new generator and prompt state per request
        generator.append_tokens(ids)
        stream = self.tokenizer.create_stream()  # GenAI's incremental decoder (whole UTF-8 only)
        produced = 0
        text = ""
        finish = "length"
        while not generator.is_done():
            if cancelled.is_set():
                return
            generator.generate_next_token()
            token = int(generator.get_next_tokens()[0])
            if token in self.eos:
                finish = "stop"
                break
            produced += 1
            piece = str(stream.decode(token))
            text += piece
            hit = next((text.index(s) for s in stops if s in text), None)
            if hit is not None:
                yield piece[: max(0, hit - (len(text) - len(piece)))], "stop", produced
                return
            if piece:
                yield piece, None, produced
        yield "", finish, produced


def _plain(message: Any) -> dict[str, Any]:
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


def _chunk(rid: str, model: str, delta: dict[str, Any], finish: str | None, usage: Any = None) -> bytes:
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
            if self.path == "/count":
                ids = self.engine.prompt_ids(body, self.engine.count_tokenizer)
                self._json(200, {"prompt_tokens": len(ids)})
            elif self.path == "/v1/chat/completions":
                self._chat(body)
            else:
                self._json(404, {"error": {"message": "not found"}})
        except (ValueError, TypeError, KeyError) as err:
            self._json(400, {"error": {"message": f"{type(err).__name__}: {err}"}})

    def _chat(self, body: dict[str, Any]) -> None:
        engine = self.engine
        rid = "chatcmpl-" + secrets.token_hex(12)
        model = str(body.get("model") or self.model_name)
        cancelled = threading.Event()
        with engine.lock:
            ids = engine.prompt_ids(body)
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
                self._send(_chunk(rid, model, {"role": "assistant", "content": ""}, None))
                for piece, end, completion in pieces:
                    if piece:
                        self._send(_chunk(rid, model, {"content": piece}, None))
                    if end is not None:
                        usage = {
                            "prompt_tokens": prompt,
                            "completion_tokens": completion,
                            "total_tokens": prompt + completion,
                        }
                        self._send(_chunk(rid, model, {}, end, usage))
                        if include_usage:
                            tail = json.loads(_chunk(rid, model, {}, None, usage)[6:])
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="worker.py")
    parser.add_argument("--model", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    key = os.environ.pop(KEY_ENV, "")
    if not key:
        print(f"worker: {KEY_ENV} is not set", file=sys.stderr)
        return 2
    engine = Engine(args.model)
    Handler.engine = engine
    Handler.key = key
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    print(f"worker: serving on 127.0.0.1:{args.port}", file=sys.stderr, flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())

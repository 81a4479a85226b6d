"""The transformers worker: one model on torch behind a small HTTP server on 127.0.0.1.

Run by path with the engine virtualenv's interpreter (``scripts/setup-transformers.sh`` makes
one), never imported by the plugin: it needs only the standard library, ``torch`` and
``transformers``, and nothing of Werk::

    <venv>/bin/python worker.py --model DIR --port P [--device cpu] [--dtype auto]

Contract (docs/transformers.md, "The worker"):

* The key is read from ``WERK_TRANSFORMERS_WORKER_KEY`` (never argv); every request must carry
  ``Authorization: Bearer <key>`` or is answered 401.
* The model and its tokenizer load before the port listens, so ``GET /health`` answering 200
  means "loaded and ready" (the adapter's residency evidence).
* ``POST /count`` ``{"messages": [...], "tools": [...]?}`` answers ``{"prompt_tokens": N}``: the
  length of the prompt the chat route would feed the model (the model's own chat template with
  the generation prompt, tokenized without extra special tokens), from a tokenizer of its own so
  a count never waits for a generation.
* ``POST /v1/chat/completions``: an OpenAI chat answer, JSON or server-sent events (chunked),
  with ``usage`` (in the final chunk; also a ``choices: []`` chunk when
  ``stream_options.include_usage``). Generations are serialized by one lock; each one keeps its
  KV cache only while it runs (the seed's "generation-local cache"). A client that goes away
  (a failed write) stops the generation at the next token.
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

KEY_ENV = "WERK_TRANSFORMERS_WORKER_KEY"
MAX_BODY = 64 << 20


class Engine:
    """The loaded model, its tokenizers and the generation lock."""

    def __init__(self, model_dir: str, device: str, dtype: str) -> None:
        torch: Any = importlib.import_module("torch")
        transformers: Any = importlib.import_module("transformers")
        self.torch = torch
        transformers.utils.logging.disable_progress_bar()
        torch_dtype: Any = "auto" if dtype == "auto" else getattr(torch, dtype)
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
        self.count_tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
        self.model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch_dtype)
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.model.to(device)
        self.model.eval()
        self.device = device
        self.lock = threading.Lock()
        eos: set[int] = set()
        for source in (self.model.generation_config.eos_token_id, self.tokenizer.eos_token_id):
            if isinstance(source, int):
                eos.add(source)
            elif isinstance(source, list):
                eos.update(i for i in source if isinstance(i, int))
        self.eos = eos

    def prompt_ids(self, tokenizer: Any, body: dict[str, Any]) -> list[int]:
        messages = [_plain(m) for m in body.get("messages") or []]
        tools = body.get("tools") or None
        text = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
        ids: list[int] = tokenizer(text, add_special_tokens=False)["input_ids"]
        return ids

    def generate(self, body: dict[str, Any], cancelled: threading.Event) -> Iterator[tuple[str, str | None, int]]:
        """Yield ``(text piece, finish_reason or None, completion tokens so far)``; the last item
        has the finish reason. Runs under the generation lock (the caller holds it)."""
        torch = self.torch
        ids = self.prompt_ids(self.tokenizer, body)
        limit = body.get("max_tokens") or body.get("max_completion_tokens")
        context = int(getattr(self.model.config, "max_position_embeddings", 0) or 0)
        room = context - len(ids) if context else 1 << 30
        max_new = min(int(limit), room) if isinstance(limit, int) else room
        temperature = float(body.get("temperature", 1.0) if body.get("temperature") is not None else 1.0)
        top_p = float(body.get("top_p") or 1.0)
        stops = body.get("stop") or []
        stops = [stops] if isinstance(stops, str) else [s for s in stops if isinstance(s, str) and s]
        generator = torch.Generator(device="cpu")
        seed = body.get("seed")
        generator.manual_seed(int(seed) if isinstance(seed, int) else secrets.randbits(62))
        produced: list[int] = []
        sent = ""
        past = None
        step = torch.tensor([ids], device=self.device)
        finish = "length"
        with torch.inference_mode():
            for _ in range(max(max_new, 0)):
                if cancelled.is_set():
                    return
                out = self.model(input_ids=step, past_key_values=past, use_cache=True)
                past = out.past_key_values
                token = _pick(torch, out.logits[0, -1].float(), temperature, top_p, generator)
                if token in self.eos:
                    finish = "stop"
                    break
                produced.append(token)
                text = str(self.tokenizer.decode(produced, skip_special_tokens=True))
                hit = next((text.index(s) for s in stops if s in text), None)
                if hit is not None:
                    yield text[len(sent) : hit], "stop", len(produced)
                    return
                if not text.endswith("\ufffd") and len(text) > len(sent):
                    yield text[len(sent) :], None, len(produced)
                    sent = text
                step = torch.tensor([[token]], device=self.device)
        text = str(self.tokenizer.decode(produced, skip_special_tokens=True))
        yield text[len(sent) :], finish, len(produced)


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


def _pick(torch: Any, logits: Any, temperature: float, top_p: float, generator: Any) -> int:
    if temperature <= 0:
        return int(torch.argmax(logits).item())
    probs = torch.softmax(logits / temperature, dim=-1)
    if top_p < 1.0:
        ordered, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(ordered, dim=-1) - ordered < top_p
        probs = torch.zeros_like(probs).scatter(0, order[keep], ordered[keep])
    return int(torch.multinomial(probs, 1, generator=generator).item())


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
                ids = self.engine.prompt_ids(self.engine.count_tokenizer, body)
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
            prompt = len(engine.prompt_ids(engine.tokenizer, body))
            pieces = engine.generate(body, cancelled)
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
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args(argv)
    key = os.environ.pop(KEY_ENV, "")
    if not key:
        print(f"worker: {KEY_ENV} is not set", file=sys.stderr)
        return 2
    engine = Engine(args.model, args.device, args.dtype)
    if args.threads > 0:
        engine.torch.set_num_threads(args.threads)
    Handler.engine = engine
    Handler.key = key
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    print(f"worker: serving on 127.0.0.1:{args.port}", file=sys.stderr, flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())

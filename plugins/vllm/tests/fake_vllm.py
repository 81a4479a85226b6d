"""A stand-in ``vllm`` executable for the tests that must run without vLLM.

It answers ``vllm --version`` and ``vllm serve --help=all`` (a help text listing the options the
plugin generates, minus those named in ``FAKE_VLLM_DROP``), and ``vllm serve MODEL ...`` runs a
small HTTP server with vLLM's shapes: ``/health``, ``/v1/models`` (``max_model_len``),
``/tokenize``, ``/v1/chat/completions`` (streamed or not, with ``usage``), ``/v1/completions``
and ``/metrics`` (Prometheus text). Like vLLM, every ``/v1`` path requires
``Authorization: Bearer $VLLM_API_KEY`` when that variable is set.

Each run appends a JSON line to ``$FAKE_VLLM_RECORD/<what>.jsonl`` (``inspect``, ``spawn``,
``request``) so tests can see what the plugin did. Like vLLM, ``serve`` starts a process of its
own (an idle stand-in for the engine core) that only its process group ties to Werk.
``FAKE_VLLM_HEALTH`` sets the status ``/health`` answers (default 200). ``FAKE_VLLM_MODE=crash`` makes ``serve``
print its key to its log and exit 1 (a startup failure whose log tail must be redacted).

With ``--runner pooling`` (or ``FAKE_VLLM_RUNNER=pooling``: a model vLLM resolves to its pooling
runner by itself) it is a pooling server like vLLM's: ``--convert classify`` a reranker
(``/rerank``), else an embedder (``/v1/embeddings`` and ``/rerank``), and it has no chat routes.
Its tokenizer is one token per whitespace-separated word (ids 5 to 504, a vocabulary of 512), its
vectors the L2-normalized mean of 8-wide vectors drawn from each token id. Like vLLM's routers, a
``GET`` of a route that exists only for ``POST`` is 405, of one that does not exist 404.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
import subprocess
import sys
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

HELP_FLAGS = (
    "  --host HOST           Host name. (default: None)",
    "  --port PORT           Port number. (default: 8000)",
    "  --served-model-name SERVED_MODEL_NAME [SERVED_MODEL_NAME ...]",
    "                        The model name(s) used in the API.",
    "  --max-model-len MAX_MODEL_LEN",
    "  --gpu-memory-utilization GPU_MEMORY_UTILIZATION, --device-memory-utilization GPU_MEMORY_UTILIZATION",
    "  --max-num-seqs MAX_NUM_SEQS",
    "  --dtype {auto,bfloat16,float,float16,float32,half}",
    "  --enable-prefix-caching, --no-enable-prefix-caching",
    "                        Whether to enable prefix caching. (default: None)",
    "  --api-key API_KEY [API_KEY ...]",
    "  --runner {auto,draft,generate,pooling}",
    "  --convert {auto,classify,embed,none}",
    "  --pooler-config POOLER_CONFIG",
)
VOCAB = 512
WIDTH = 8


def words(text: str) -> list[int]:
    return [5 + zlib.crc32(w.encode()) % 500 for w in text.split()]


def vector(tokens: list[int]) -> list[float]:
    total = [0.0] * WIDTH
    for token in tokens:
        raw = hashlib.sha256(str(token).encode()).digest()
        for i, x in enumerate(struct.unpack(f"<{WIDTH}i", raw)):
            total[i] += x / 2**31
    norm = math.sqrt(sum(x * x for x in total)) or 1.0
    return [x / norm for x in total]


def record(what: str, doc: dict[str, Any]) -> None:
    where = os.environ.get("FAKE_VLLM_RECORD")
    if where:
        with open(os.path.join(where, f"{what}.jsonl"), "a", encoding="utf-8") as handle:
            handle.write(json.dumps(doc) + "\n")


def last(argv: list[str], flag: str, default: str | None = None) -> str | None:
    value = default
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
    return value


def count(body: dict[str, Any]) -> int:
    messages = body.get("messages") or []
    words = sum(len(str(m.get("content", "")).split()) for m in messages if isinstance(m, dict))
    return words + 3 * len(messages) + (2 if body.get("add_generation_prompt", True) else 0)


def serve(argv: list[str]) -> int:
    key = os.environ.get("VLLM_API_KEY")
    # Like vLLM's engine core: a process of our own that nothing but its process group ties to Werk.
    engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    record(
        "spawn",
        {
            "argv": argv,
            "pid": os.getpid(),
            "engine_pid": engine.pid,
            "hf_hub_offline": os.environ.get("HF_HUB_OFFLINE"),
            "has_key": bool(key),
        },
    )
    if os.environ.get("FAKE_VLLM_MODE") == "crash":
        print(f"ValueError: cannot load the model (api key {key})", flush=True)
        return 1
    name = last(argv, "--served-model-name", "model") or "model"
    max_len = int(last(argv, "--max-model-len", "2048") or 2048)
    pooling = last(argv, "--runner", os.environ.get("FAKE_VLLM_RUNNER")) == "pooling"
    mode = ("rank" if last(argv, "--convert") == "classify" else "embed") if pooling else "chat"
    routes = {
        "chat": ("/tokenize", "/v1/chat/completions", "/v1/completions"),
        "embed": ("/tokenize", "/v1/embeddings", "/rerank"),
        "rank": ("/tokenize", "/rerank"),
    }[mode]
    stats = {"queries": 0.0, "hits": 0.0}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            print(format % args, flush=True)

        def send(self, status: int, doc: Any, content_type: str = "application/json") -> None:
            raw = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def authorized(self) -> bool:
            if not self.path.startswith("/v1") or not key:
                return True
            if self.headers.get("Authorization") == f"Bearer {key}":
                return True
            self.send(401, {"error": "Unauthorized"})
            return False

        def do_GET(self) -> None:
            if not self.authorized():
                return
            if self.path == "/health":
                self.send(int(os.environ.get("FAKE_VLLM_HEALTH", "200")), b"", "text/plain")
            elif self.path == "/v1/models":
                self.send(200, {"object": "list", "data": [{"id": name, "max_model_len": max_len}]})
            elif self.path == "/metrics":
                text = (
                    "# TYPE vllm:num_requests_running gauge\n"
                    f'vllm:num_requests_running{{engine="0",model_name="{name}"}} 0.0\n'
                    "# TYPE vllm:num_requests_waiting gauge\n"
                    f'vllm:num_requests_waiting{{engine="0",model_name="{name}"}} 0.0\n'
                    "# TYPE vllm:kv_cache_usage_perc gauge\n"
                    f'vllm:kv_cache_usage_perc{{engine="0",model_name="{name}"}} 0.25\n'
                    "# TYPE vllm:prefix_cache_queries counter\n"
                    f'vllm:prefix_cache_queries_total{{engine="0",model_name="{name}"}} {stats["queries"]}\n'
                    "# TYPE vllm:prefix_cache_hits counter\n"
                    f'vllm:prefix_cache_hits_total{{engine="0",model_name="{name}"}} {stats["hits"]}\n'
                )
                self.send(200, text.encode(), "text/plain; version=0.0.4")
            elif self.path in routes:
                self.send(405, {"detail": "Method Not Allowed"})
            else:
                self.send(404, {"error": "not found"})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            if not self.authorized():
                return
            record("request", {"path": self.path, "body": body, "auth": self.headers.get("Authorization") is not None})
            if self.path not in routes:
                self.send(404, {"detail": "Not Found"})
                return
            if self.path == "/tokenize" and "prompt" in body:
                tokens = words(str(body["prompt"]))
                self.send(200, {"count": len(tokens), "max_model_len": max_len, "tokens": tokens})
                return
            if self.path in ("/v1/embeddings", "/rerank"):
                self.pooled(body)
                return
            if self.path == "/tokenize":
                n = count(body)
                self.send(200, {"count": n, "max_model_len": max_len, "tokens": list(range(n))})
                return
            if self.path not in ("/v1/chat/completions", "/v1/completions"):
                self.send(404, {"error": "not found"})
                return
            if body.get("model") != name:
                self.send(404, {"error": {"message": f"The model `{body.get('model')}` does not exist."}})
                return
            prompt = count(body) if "messages" in body else len(str(body.get("prompt", "")).split())
            stats["queries"] += prompt
            stats["hits"] += prompt // 2
            usage = {"prompt_tokens": prompt, "completion_tokens": 1, "total_tokens": prompt + 1}
            chat = self.path == "/v1/chat/completions"
            if body.get("stream"):
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for word in ("hello", " there"):
                    delta = {"delta": {"content": word}} if chat else {"text": word}
                    chunk = {"id": "x", "object": "chunk", "model": name, "choices": [{"index": 0, **delta}]}
                    data = f"data: {json.dumps(chunk)}\n\n".encode()
                    self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                    self.wfile.flush()
                    time.sleep(0.05)
                done = b"data: [DONE]\n\n"
                self.wfile.write(f"{len(done):x}\r\n".encode() + done + b"\r\n0\r\n\r\n")
                return
            choice = {"index": 0, "finish_reason": "length"}
            choice.update({"message": {"role": "assistant", "content": "hi"}} if chat else {"text": "hi"})
            self.send(200, {"id": "x", "object": "completion", "model": name, "choices": [choice], "usage": usage})

        def pooled(self, body: dict[str, Any]) -> None:
            if body.get("model") != name:
                self.send(404, {"error": {"message": f"The model `{body.get('model')}` does not exist."}})
                return
            if self.path == "/rerank":
                query = vector(words(body["query"]))
                docs = [words(d) for d in body["documents"]]
                scores = [sum(a * b for a, b in zip(query, vector(d), strict=True)) for d in docs]
                results = [{"index": i, "relevance_score": s} for i, s in enumerate(scores)]
                results.sort(key=lambda r: -r["relevance_score"])
                used = sum(len(words(body["query"])) + len(d) for d in docs)
                self.send(200, {"results": results, "usage": {"prompt_tokens": used, "total_tokens": used}})
                return
            raw = body["input"]
            items = [raw] if isinstance(raw, str) or (raw and isinstance(raw[0], int)) else raw
            tokens = [words(x) if isinstance(x, str) else x for x in items]
            if any(t >= VOCAB for ts in tokens for t in ts):
                self.send(400, {"error": {"message": "Token id 99999 is out of vocabulary (fake vllm raw text)"}})
                return
            if body.get("dimensions") is not None:
                self.send(400, {"error": {"message": f"Model {name!r} does not support Matryoshka embeddings"}})
                return
            data = [{"index": i, "object": "embedding", "embedding": vector(t)} for i, t in enumerate(tokens)]
            used = sum(len(t) for t in tokens)
            self.send(200, {"object": "list", "data": data, "usage": {"prompt_tokens": used, "total_tokens": used}})

    host = last(argv, "--host", "127.0.0.1") or "127.0.0.1"
    port = int(last(argv, "--port", "8000") or 8000)
    server = ThreadingHTTPServer((host, port), Handler)
    print(f"fake vllm serving {name} on {host}:{port}", flush=True)
    server.serve_forever()
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["--version"]:
        print(os.environ.get("FAKE_VLLM_VERSION", "0.0.0+fake"))
        return 0
    if argv[:2] == ["serve", "--help=all"]:
        record("inspect", {"pid": os.getpid()})
        dropped = set(filter(None, os.environ.get("FAKE_VLLM_DROP", "").split(",")))
        print("usage: vllm serve [model_tag] [options]\n\noptions:")
        for line in HELP_FLAGS:
            if not any(line.strip().startswith(flag + " ") or line.strip() == flag for flag in dropped):
                print(line)
        return 0
    if argv[:1] == ["serve"]:
        return serve(argv[1:])
    print(f"fake vllm: unsupported arguments {argv}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
